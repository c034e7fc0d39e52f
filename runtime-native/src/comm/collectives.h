// The collective instructions of a plan (ir/ops.ts: all_reduce … recv) on a Communicator.
//
// Each op resolves its group through the instruction's `group` attribute (a group kind such as
// dp, tp, pp), looked up in this rank's rankGroups, and runs on that group's communicator of the
// instruction's stream. Semantics, P the group size and r this rank's group rank:
//   all_reduce      y = Σ x                          (f32, f64, bf16, i32, i64; in place; bf16 is
//                   summed in f32 and rounded once per element, see the backends in comm.h)
//   all_gather      y = x_0 ‖ … ‖ x_{P−1} along dim 0
//   reduce_scatter  y = block r of Σ x along dim 0 (Communicator::reduceScatter: each rank
//                   receives only its block, summed in group order); in place (y is x): block r of
//                   x becomes block r of Σ x, the others are undefined (the distributed
//                   optimizer's gradient buckets); no scratch
//   broadcast       y = x of group rank `root`                    (in place)
//   all_to_all_v    rows x [N, H] go in consecutive blocks of send_counts i32 [P] to each rank;
//                   counts are exchanged first; y [out_rows, H] = the received blocks in group
//                   order, recv_counts i32 [P] = what each rank sent here
//   gather_v        on `root`: y = x_0 ‖ … ‖ x_{P−1} (row counts exchanged first)
//   scatter_v       the root's x split in consecutive blocks, block i to group rank i; each rank
//                   receives the rows its output resolves to at this microbatch's sizes (those
//                   counts go to the root first, so the root checks they fit its rows)
//   all_gather_v    y = x_0 ‖ … ‖ x_{P−1} along dim 0, counts i32 [P] the rows of each rank (the
//                   same list on every rank); one broadcast per rank straight into its block
//   reduce_scatter_v  y = block r of Σ x, x in consecutive blocks of counts i32 [P] rows; this
//                   rank's block of every rank lands in scratch and is summed in group order
//   send / recv     to / from group rank `peer`, matched by `tag`
// The variable-size ops (all_to_all_v, gather_v, scatter_v, all_gather_v, reduce_scatter_v) report the rows they wrote: output 0
// holds that many rows, fewer than its planned bound, and the executor hands later instructions
// the received row count (through output 0's run-time symbol when its dim 0 is one:
// core/executor.h).
#pragma once

#include <string>

#include "comm/comm.h"
#include "core/program.h"
#include "ops/op.h"

namespace lfc::comm {

// Load-time checks of a collective instruction: operand counts and attributes. "" when fine.
std::string checkCollective(const Instr& in, const SymbolTable& symbols);
// Output 0 may be input 0 (same bytes): all_reduce, broadcast.
bool collectiveInPlace(Op op);

// A collective failed because another rank did: the OpError naming the group, and the reason
// (PeerFailure's) that this rank passes on when it aborts its backend.
struct PeerFailedError : OpError {
  PeerFailedError(const std::string& what, std::string reason) : OpError(what), reason(std::move(reason)) {}
  std::string reason;
};

// Runs one collective instruction. Returns the rows written to output 0 when they depend on the
// data (the variable-size ops), else −1. Throws OpError naming the group (a
// PeerFailedError when another rank's failure ended it).
// batchEnd: the instruction is the last of a batched send/recv (its stream's next instruction has
// another batch): every posted send and recv of the batch completes before it returns
int64_t runCollective(const Instr& in, StepCtx& c, Backend& backend, bool batchEnd = false);

}  // namespace lfc::comm
