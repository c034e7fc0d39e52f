// The executor: one thread per stream that has instructions, each running its stream's
// instructions in issue order. Before an instruction starts, its thread waits until every event in
// `wait` has been recorded; when it ends, the events in `record` are recorded. Events reset every
// step. The first failure (a kernel's exception) stops the step: the failing thread records the
// error, every waiting thread wakes up and leaves, all threads are joined, and the error — naming
// the instruction index, op and scope — is thrown to the caller.
//
// Collective instructions run on the backend's communicator of their group and stream. A
// variable-size collective (all_to_all_v, gather_v, scatter_v) reports the rows it wrote. When its
// output's dim 0 is a run-time symbol (`Rx0`: core/shape.h), that symbol takes the row count for
// the instruction's microbatch, and every later instruction of that microbatch sees it in every
// operand over the symbol (the step starts with run-time symbols at their bounds; a second
// collective writing the same symbol of the same microbatch must receive as many rows). Otherwise
// later instructions that read that same buffer see the row count as its dim 0 (the buffer's
// declared dim is only a bound). Consumers are ordered after the collective by their stream or
// an event, so they see the value it set. A failure aborts the backend (comm.h) before the step
// throws, which tells the other ranks and wakes this rank's stream threads blocked in a
// collective, so they are joined. One that still does not return is waited for kAbandonAfter, then
// left behind (detached, with everything it uses kept alive: the program, the backend, the
// operands and the scratch's owner) and the failure is reported; the runtime must not step again.
#pragma once

#include <array>
#include <chrono>
#include <memory>
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
  double startWallMs = 0;           // when timing starts: the system clock, ms since the epoch
  std::vector<int64_t> rows;        // per buffer: rows a variable-size collective wrote, or −1
  std::vector<SymbolSizes> sizes;   // per microbatch slot: every symbol's value at the step's end
  // per stream: the most scratch bytes one of its instructions held at once (its slice's high-water)
  std::array<int64_t, kStreamCount> scratchHighBytes{};
};

// A stream's slice of the scratch region: where its thread's cpu::ScratchArena takes from.
struct ScratchSlice {
  std::byte* base = nullptr;
  int64_t bytes = 0;
};

// Thrown when a failed step left stream threads blocked in collectives.
struct AbandonedStepError : RuntimeError {
  using RuntimeError::RuntimeError;
};

// Thrown when the step failed in a collective: a check of its own (a receive bound, a row count),
// its communicator, or another rank's failure. The run's failure, not the runtime's (an internal
// error): the caller reports it in one line.
struct CollectiveStepError : RuntimeError {
  using RuntimeError::RuntimeError;
};

// operands[i] / results[i]: instruction i's inputs and outputs, resolved for this step (run-time
// symbols at their bounds). sizes: per microbatch slot, the symbols' values the step starts with.
// scratch: per stream, its planned slice; every scratch take of an instruction comes from it and
// is released when the instruction ends, and a take past the slice fails the step naming the
// instruction, what it asked and what was planned. keepAlive: what owns the slices' bytes (kept
// by threads left behind). backend: null for a program without collectives.
ExecResult execute(std::shared_ptr<const Program> program, std::vector<std::vector<Tensor>> operands,
                   std::vector<std::vector<Tensor>> results, std::vector<SymbolSizes> sizes,
                   const StepParams& params, const std::array<ScratchSlice, kStreamCount>& scratch,
                   std::shared_ptr<const void> keepAlive, bool timing, std::shared_ptr<comm::Backend> backend);

}  // namespace lfc
