// Storage dtypes of kernel operands, and the dispatch on them that every kernel family's entry
// points share.
//
// Each kernel family (<family>.h) has two layers:
//   1. the compute core, `template <typename Real> void gelu_forward(Real* y, const Real* x, …)`,
//      instantiated for float and double: the math on one element type, with an lfc::cpu::ref
//      twin where there is an optimized path. The fd/ and ref/ checks run these.
//   2. the entry point the ops call, `void gelu_forward(Dst y, Src x, …)`: every operand is a
//      pointer with its own storage dtype, f32, bf16 or f64, independently of the others.
//      by_dtype runs the core in double when every operand is f64 (the finite-difference path),
//      and otherwise in float through a Staging<float>:
//        - an f32 operand is used in place (so an all-f32 call is the core on the buffers
//          themselves: bit for bit what the runtime computed before bf16 existed);
//        - a bf16 input is loaded into an f32 copy (exact);
//        - a bf16 output gets an f32 copy holding its current values (so accumulating kernels,
//          and elements a kernel leaves alone, behave as on f32), rounded to bf16 (nearest even)
//          once, after the core returns. A core that throws leaves the output untouched.
//      So on bf16 storage a kernel computes exactly the f32 kernel on the upconverted inputs and
//      rounds each output element once: GEMMs run as cblas_sgemm on f32 copies and accumulate in
//      f32; norms, softmax and losses keep their statistics in f32 (double where the core sums in
//      double). A mix of f64 with other dtypes, or a dtype the kernels do not store (f16,
//      integers), throws KernelError naming the kernel.
//
// A fast path for one (op, dtypes) pair, say a bf16 GEMM or an AVX-512 loop, goes at the top of
// that op's entry point, before by_dtype, as a test of the operands' dtypes; the ops layer, which
// only hands over dtype-tagged pointers, does not change. Staged copies are taken from the
// thread's ScratchArena (below) and released when the call returns: on a stream thread of the
// runtime that is the stream's planned scratch, so compiler/plan/scratch.ts counts them (n·4 bytes
// per bf16 operand of n elements, rounded up to 64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common.h"
#include "core/bf16.h"
#include "core/dtype.h"

namespace lfc::cpu {

using lfc::DType;

// A read operand: row-major elements of one storage dtype. data null: an absent optional operand.
struct Src {
  const void* data = nullptr;
  DType dtype = DType::f32;
  // the operand from element i on
  Src at(int64_t i) const { return {static_cast<const std::byte*>(data) + i * dtypeBytes(dtype), dtype}; }
};

// A written (or accumulated) operand.
struct Dst {
  void* data = nullptr;
  DType dtype = DType::f32;
  operator Src() const { return {data, dtype}; }
  Dst at(int64_t i) const { return {static_cast<std::byte*>(data) + i * dtypeBytes(dtype), dtype}; }
};

// y (n) = x (n) between the storage dtypes f32, bf16, f64 (to bf16: through float, rounded to
// nearest even). y and x may be the same buffer only when their dtypes are equal.
void convert(Dst y, Src x, int64_t n);

// Whether a kernel over these operands runs in double: true when every present operand is f64,
// false when none is. Throws KernelError naming the kernel on a mix, or on a dtype other than f32,
// bf16, f64.
bool runs_in_f64(const char* kernel, const Src* first, const Src* last);
inline bool runs_in_f64(const char* kernel, std::initializer_list<Src> operands) {
  return runs_in_f64(kernel, operands.begin(), operands.end());
}

// Scratch: the temporaries of one kernel call or op that the IR does not name (staged f32 copies,
// norm statistics, attention's score tiles, counts per expert), one stack per thread.
//
// Bound (the runtime's stream threads): every take() is carved from a planned block, the stream's
// slice of the program's scratch region (compiler/plan/scratch.ts computes how much each
// instruction takes); a take past its end throws ScratchOverflow, which names what was asked and
// what was planned, and nothing grows. Unbound (the kernel checks, any other thread): each take()
// is a heap block of its own, freed on release. Sizes are rounded up to 64 bytes, so a block of
// takes is the sum of the rounded sizes; mark/release nest like a stack (RAII: ScratchScope).
struct ScratchOverflow : KernelError {
  using KernelError::KernelError;
};

class ScratchArena {
 public:
  static constexpr int64_t kAlign = 64;
  static int64_t rounded(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  // takes come from [base, base + capacity) (base 64-byte aligned) from now on; `what` names the
  // block in an overflow message ("stream compute")
  void bind(std::byte* base, int64_t capacity, std::string what);
  void unbind();
  bool bound() const { return bound_; }
  int64_t capacity() const { return capacity_; }

  // `bytes` of uninitialized memory, 64-byte aligned, until a release below this take's mark
  void* take(int64_t bytes);
  template <typename T>
  T* take(int64_t n) {
    return static_cast<T*>(take(n * int64_t(sizeof(T))));
  }
  int64_t mark() const { return used_; }
  void release(int64_t mark);
  // the most bytes in use at once since the last resetHigh
  int64_t high() const { return high_; }
  void resetHigh() { high_ = used_; }

  static ScratchArena& of_this_thread();

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  struct HeapBlock {
    int64_t mark;  // used_ before the take
    std::unique_ptr<std::byte, Free> bytes;
  };
  std::byte* base_ = nullptr;
  int64_t capacity_ = 0;
  bool bound_ = false;
  std::string what_;
  int64_t used_ = 0, high_ = 0;
  std::vector<HeapBlock> heap_;  // unbound: the live takes, in order
};

// Releases every take made during its lifetime.
class ScratchScope {
 public:
  ScratchScope() : arena_(ScratchArena::of_this_thread()), mark_(arena_.mark()) {}
  ~ScratchScope() { arena_.release(mark_); }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;
  template <typename T>
  T* take(int64_t n) {
    return arena_.take<T>(n);
  }

 private:
  ScratchArena& arena_;
  int64_t mark_;
};

template <typename Real>
class Staging;

// The double path: every operand is f64 and used in place.
template <>
class Staging<double> {
 public:
  using Real = double;
  explicit Staging(const char*) {}
  const double* in(Src x, int64_t) const { return static_cast<const double*>(x.data); }
  double* out(Dst y, int64_t) const { return static_cast<double*>(y.data); }
  std::vector<const double*> in(const std::vector<Src>& xs, int64_t n) const;
  std::vector<double*> out(const std::vector<Dst>& ys, int64_t n) const;
};

// The float path: f32 operands in place, bf16 ones through f32 copies (see the top of this file).
template <>
class Staging<float> {
 public:
  using Real = float;
  explicit Staging(const char* kernel);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // x (n) as float: x itself when f32, else an f32 copy; null stays null
  const float* in(Src x, int64_t n);
  // y (n) as float: y itself when f32, else an f32 copy of its values that store() rounds back
  float* out(Dst y, int64_t n);
  std::vector<const float*> in(const std::vector<Src>& xs, int64_t n);
  std::vector<float*> out(const std::vector<Dst>& ys, int64_t n);
  // every staged output rounded into its buffer
  void store();

 private:
  struct Pending {
    Dst dst;
    const float* values;
    int64_t n;
  };
  const char* kernel_;
  ScratchArena& arena_;
  int64_t mark_;
  std::vector<Pending> pending_;
};

// Runs body(staging) with a Staging<double> when every operand is f64, else with a
// Staging<float> whose outputs are stored after body returns. body calls the compute core with
// staging.in(…) / staging.out(…); `typename std::decay_t<decltype(s)>::Real` names its type.
template <typename Body>
void by_dtype(const char* kernel, const Src* first, const Src* last, Body&& body) {
  if (runs_in_f64(kernel, first, last)) {
    Staging<double> s(kernel);
    body(s);
  } else {
    Staging<float> s(kernel);
    body(s);
    s.store();
  }
}
template <typename Body>
void by_dtype(const char* kernel, std::initializer_list<Src> operands, Body&& body) {
  by_dtype(kernel, operands.begin(), operands.end(), body);
}
template <typename Body>
void by_dtype(const char* kernel, const std::vector<Src>& operands, Body&& body) {
  by_dtype(kernel, operands.data(), operands.data() + operands.size(), body);
}

}  // namespace lfc::cpu
