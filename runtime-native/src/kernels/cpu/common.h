// Shared by the CPU kernels: the error type and the dimension letters.
//
// Every kernel is a plain function over raw row-major pointers, templated on the element type
// `Real` (float and double are instantiated), in namespace lfc::cpu; a plain reference version of
// each optimized kernel lives in lfc::cpu::ref next to it. Next to each core, an entry point of the
// same name on dtype-tagged operands (Src, Dst: f32, bf16 or f64 each) dispatches on storage dtype
// (storage.h); the ops call those. Outputs come first in the argument list,
// then inputs, then sizes; a scalar output (a loss) is the return value. A gradient argument named d<param> of a weight ACCUMULATES (+=): a weight
// used several times sums its gradients and the caller zeroes it once per step. A gradient of an
// activation (dx, dq, dlogits, ...) is OVERWRITTEN. Each header says so per function.
//
// Dimension letters, used in the shape comments and as size-argument names (as in ir/ops.ts):
//   T tokens   H hidden   V vocab   E experts   k top-k   N rows (tokens·k, permuted)
//   nh / nkv query / KV heads   d head dim   P position sections   R rows of a norm
//   in / out features of a linear   Nv visual rows
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace lfc::cpu {

// Block sizes of the pooled kernels (core/thread_pool.h): fixed, so that a kernel's blocks, and the
// order its partials are summed in, never depend on the thread count.
constexpr int64_t kElementGrain = 16384;  // elements of a block of an elementwise loop
constexpr int64_t kRowGrainBytes = 65536; // rows of a row kernel (a norm, a loss): about this much input

// rows (of `rowBytes` each) in a block of a pooled row kernel: ≥ 1
inline int64_t row_grain(int64_t rowBytes) { return rowBytes >= kRowGrainBytes ? 1 : kRowGrainBytes / rowBytes; }

// A kernel reports a bad argument (an id out of range, counts that do not add up, a placeholder
// count that differs from the visual rows) by throwing KernelError, whose message starts with the
// kernel's name. Nothing is written to the outputs before the check fails, except where the
// header of that kernel says otherwise.
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream msg;
  (msg << ... << parts);
  throw KernelError(msg.str());
}

}  // namespace lfc::cpu

// Throws KernelError with the streamed message parts when cond is false; the message is only built
// on failure.
#define LFC_KERNEL_CHECK(cond, ...)           \
  do {                                        \
    if (!(cond)) ::lfc::cpu::fail(__VA_ARGS__); \
  } while (0)
