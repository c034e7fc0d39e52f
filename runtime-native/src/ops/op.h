// What an op implementation sees: the instruction, its operands resolved to pointers and shapes
// at this step's microbatch sizes, the step's learning rate and count, and scratch memory.
//
// An op implementation is `void run_<op>(const Instr&, StepCtx&)` (declared in ops.h, listed in
// the registry). It reads attributes through the typed getters below (present and well-typed:
// the loader checked them against the registry's attribute list), checks what the plan cannot
// have checked (dtypes the kernels take, sizes that must agree after resolution), and calls the
// kernels' entry points with dtype-tagged operands (src, dst below). It throws OpError on a
// problem; the executor adds the instruction index, op and scope.
//
// Output semantics follow the IR: every output is OVERWRITTEN. Kernels that accumulate into a
// weight gradient (d<param> += …) get a zeroed output first; grad_accumulate, the fused wgrad
// accumulations (linear_wgrad_accumulate, grouped_linear_wgrad_accumulate) and adamw are the ops
// that update persistent buffers in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/program.h"
#include "kernels/cpu/storage.h"

namespace lfc {

struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One operand of an instruction at this step's sizes.
struct Tensor {
  std::byte* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int buffer = -1;

  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data);
  }
  int rank() const { return int(shape.size()); }
  // dim i; negative i counts from the end
  int64_t dim(int i) const { return shape.at(size_t(i < 0 ? int(shape.size()) + i : i)); }
  int64_t last() const { return shape.empty() ? 1 : shape.back(); }
  // elements / last dim: the rows of a [..., H] tensor
  int64_t rows() const { return last() == 0 ? 0 : numel / last(); }
  int64_t bytes() const { return numel * dtypeBytes(dtype); }
};

// This rank's index inside each of its process groups, by group kind ("tp", "ep", "pp", …), for
// the ops whose work depends on it (group_slice, the vocab-parallel embedding and cross-entropy
// pieces). The runtime fills it once per rank from the plan; a kind never set reads as 0, which is
// also what a one-rank plan means.
class GroupRanks {
 public:
  void set(const std::string& kind, int rank) { ranks_[kind] = rank; }
  int rank(const std::string& kind) const {
    auto it = ranks_.find(kind);
    return it == ranks_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, int> ranks_;
};

struct StepParams {
  double lr = 0;
  int64_t step = 1;  // t ≥ 1 for AdamW
  // the forward phase alone (an evaluation): the other instructions are skipped, each still
  // waiting on and recording its events, so the streams keep the step's order
  bool forwardOnly = false;
  // this rank's group ranks (owned by the runtime, constant over the run); null: every kind is 0
  const GroupRanks* groupRanks = nullptr;
};

class StepCtx {
 public:
  StepCtx(const Instr& instr, std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
          const StepParams& params)
      : instr_(instr), inputs_(inputs), outputs_(outputs), params_(params) {}

  const Tensor& in(int i) const { return inputs_.at(size_t(i)); }
  const Tensor& out(int i) const { return outputs_.at(size_t(i)); }
  int numIn() const { return int(inputs_.size()); }
  int numOut() const { return int(outputs_.size()); }
  const StepParams& params() const { return params_; }
  // temporaries the IR does not name (norm statistics, the cross-entropy log-sum-exp, the
  // router's renormalized weights, a collective's staging): this thread's scratch, on a stream
  // thread the stream's planned slice, released when the instruction ends (the executor resets
  // it). compiler/plan/scratch.ts counts every take.
  template <typename T>
  T* scratch(int64_t n) {
    return cpu::ScratchArena::of_this_thread().take<T>(n);
  }
  // this rank's index in its group of the given kind (0 when the runtime set none)
  int groupRank(const std::string& kind) const {
    return params_.groupRanks ? params_.groupRanks->rank(kind) : 0;
  }

  // attributes (checked at load; a missing optional attribute gives the fallback)
  double num(const char* name) const;
  double num(const char* name, double fallback) const;
  int64_t integer(const char* name) const;
  bool flag(const char* name) const;
  std::string str(const char* name) const;
  std::vector<int64_t> ints(const char* name) const;
  std::vector<double> numbers(const char* name) const;
  bool has(const char* name) const;

 private:
  const Instr& instr_;
  std::vector<Tensor>& inputs_;
  std::vector<Tensor>& outputs_;
  const StepParams& params_;
};

// ---- checks shared by the op implementations ---------------------------------------------

// t has dtype want; `what` names the operand ("input 1 (ids)").
void requireDType(const Tensor& t, DType want, const char* what);
// a and b hold the same number of elements
void requireNumel(const Tensor& t, int64_t want, const char* what);
void requireRank(const Tensor& t, int rank, const char* what);

// ---- operands of the kernels' entry points (kernels/cpu/storage.h) ------------------------------
//
// An op hands the kernels dtype-tagged pointers and never dispatches on a float dtype itself: each
// float operand may be f32 or bf16 independently (or every one f64), and the kernel family's entry
// point dispatches (by_dtype, or a fast path for its dtypes). Statistics an op keeps in scratch
// (norm mean and rstd, a log-sum-exp) take computeDType: f32, or f64 on the f64 path.

inline cpu::Src src(const Tensor& t) { return {t.data, t.dtype}; }
inline cpu::Dst dst(const Tensor& t) { return {t.data, t.dtype}; }
// t is a float operand the kernels store: f32, bf16 or f64 (they check f64 is all or none)
void requireFloat(const Tensor& t, const char* what);
// … holding n elements
void requireFloat(const Tensor& t, int64_t n, const char* what);
// the compute dtype of a kernel over the float operand t
inline DType computeDType(const Tensor& t) { return t.dtype == DType::f64 ? DType::f64 : DType::f32; }
// a scratch array of n elements of dtype (contents undefined), as a kernel operand
inline cpu::Dst scratchOf(StepCtx& c, int64_t n, DType dtype) { return {c.scratch<std::byte>(n * dtypeBytes(dtype)), dtype}; }

// Reads a scalar tensor (one element, any float or int dtype) as double.
double scalarValue(const Tensor& t, const char* what);
// Writes a scalar tensor (one element) from a double.
void setScalarValue(const Tensor& t, double v, const char* what);

void zero(const Tensor& t);

}  // namespace lfc
