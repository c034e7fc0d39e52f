// The executor: one thread per stream that has instructions, each running its stream's
// instructions in issue order. Before an instruction starts, its thread waits until every event in
// `wait` has been recorded; when it ends, the events in `record` are recorded. Events reset every
// step. The first failure (a kernel's exception) stops the step: the failing thread records the
// error, every waiting thread wakes up and leaves, all threads are joined, and the error — naming
// the instruction index, op and scope — is thrown to the caller.
//
// Collective instructions run on the backend's communicator of their group and stream. A
// variable-size collective (all_to_all_v, gather_v, scatter_v) reports the rows it wrote; later
// instructions that read the same buffer see that row count as its dim 0 (the buffer's declared
// dim is only a bound). A stream thread blocked in a collective cannot be woken by a failure on
// another stream: the executor waits kAbandonAfter for it, then leaves it behind (detached, with
// the state it uses kept alive) and reports the failure; the runtime must not step again.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "core/error.h"
#include "core/program.h"
#include "ops/op.h"

namespace lfc {

constexpr std::chrono::seconds kAbandonAfter{5};

struct InstrTiming {
  double startMs = 0, endMs = 0;  // since the step started
};

struct ExecResult {
  int instructionsRun = 0;
  std::vector<InstrTiming> timing;  // per instruction when asked for
  std::vector<int64_t> rows;        // per buffer: rows a variable-size collective wrote, or −1
};

// Thrown when a failed step left stream threads blocked in collectives.
struct AbandonedStepError : RuntimeError {
  using RuntimeError::RuntimeError;
};

// operands[i] / results[i]: instruction i's inputs and outputs, resolved for this step.
// scratch: one per stream, kept between steps. backend: null for a program without collectives.
ExecResult execute(const Program& p, std::vector<std::vector<Tensor>> operands,
                   std::vector<std::vector<Tensor>> results, const StepParams& params,
                   std::vector<Scratch>& scratch, bool timing, comm::Backend* backend);

}  // namespace lfc
