// The executor: one thread per stream that has instructions, each running its stream's
// instructions in issue order. Before an instruction starts, its thread waits until every event in
// `wait` has been recorded; when it ends, the events in `record` are recorded. Events reset every
// step. The first failure (a kernel's exception) stops the step: the failing thread records the
// error, every waiting thread wakes up and leaves, all threads are joined, and the error — naming
// the instruction index, op and scope — is thrown to the caller.
#pragma once

#include <vector>

#include "core/program.h"
#include "ops/op.h"

namespace lfc {

struct InstrTiming {
  double startMs = 0, endMs = 0;  // since the step started
};

struct ExecResult {
  int instructionsRun = 0;
  std::vector<InstrTiming> timing;  // per instruction when asked for
};

// operands[i] / results[i]: instruction i's inputs and outputs, resolved for this step.
// scratch: one per stream, kept between steps.
ExecResult execute(const Program& p, std::vector<std::vector<Tensor>>& operands,
                   std::vector<std::vector<Tensor>>& results, const StepParams& params,
                   std::vector<Scratch>& scratch, bool timing);

}  // namespace lfc
