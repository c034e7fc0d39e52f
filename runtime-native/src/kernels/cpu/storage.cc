#include "storage.h"

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <new>
#include <sstream>

namespace lfc::cpu {

namespace {

std::string cat_scratch(const std::string& what, int64_t asked, int64_t used, int64_t planned) {
  std::ostringstream m;
  m << "scratch of " << what << ": asked " << asked << " bytes with " << used << " in use, but the plan gives "
    << planned << " (the program's scratchBytes; compiler/plan/scratch.ts under-counts this op)";
  return m.str();
}

bool stored(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f64; }

template <typename To, typename From>
void convert_loop(To* y, const From* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = To(x[i]);
}

}  // namespace

void convert(Dst y, Src x, int64_t n) {
  LFC_KERNEL_CHECK(stored(y.dtype) && stored(x.dtype), "convert: ", dtypeName(x.dtype), " → ",
                   dtypeName(y.dtype), " (the kernels store f32, bf16, f64)");
  if (n <= 0 || y.data == x.data) return;
  auto* yb = static_cast<bf16*>(y.data);
  const auto* xb = static_cast<const bf16*>(x.data);
  auto* yf = static_cast<float*>(y.data);
  const auto* xf = static_cast<const float*>(x.data);
  auto* yd = static_cast<double*>(y.data);
  const auto* xd = static_cast<const double*>(x.data);
  switch (y.dtype) {
    case DType::bf16:
      if (x.dtype == DType::bf16) std::memcpy(yb, xb, size_t(n) * sizeof(bf16));
      else if (x.dtype == DType::f32) bf16FromFloat(yb, xf, n);
      else
        for (int64_t i = 0; i < n; i++) yb[i] = toBf16(float(xd[i]));
      return;
    case DType::f32:
      if (x.dtype == DType::bf16) floatFromBf16(yf, xb, n);
      else if (x.dtype == DType::f32) std::memcpy(yf, xf, size_t(n) * sizeof(float));
      else convert_loop(yf, xd, n);
      return;
    default:  // f64
      if (x.dtype == DType::bf16)
        for (int64_t i = 0; i < n; i++) yd[i] = double(toFloat(xb[i]));
      else if (x.dtype == DType::f32) convert_loop(yd, xf, n);
      else std::memcpy(yd, xd, size_t(n) * sizeof(double));
      return;
  }
}

bool runs_in_f64(const char* kernel, const Src* first, const Src* last) {
  int f64 = 0, other = 0;
  for (const Src* s = first; s != last; s++) {
    if (!s->data) continue;
    LFC_KERNEL_CHECK(stored(s->dtype), kernel, ": an operand has dtype ", dtypeName(s->dtype),
                     "; the kernels take f32, bf16 or f64");
    (s->dtype == DType::f64 ? f64 : other)++;
  }
  LFC_KERNEL_CHECK(f64 == 0 || other == 0, kernel, ": ", f64, " f64 operands mixed with ", other,
                   " f32/bf16 ones; f64 runs only when every float operand is f64");
  return f64 > 0;
}

// ---- scratch ----------------------------------------------------------------------------------

void ScratchArena::Free::operator()(std::byte* p) const { std::free(p); }

void ScratchArena::bind(std::byte* base, int64_t capacity, std::string what) {
  LFC_KERNEL_CHECK(used_ == 0, "scratch: bound while ", used_, " bytes are in use");
  base_ = base;
  capacity_ = capacity;
  bound_ = true;
  what_ = std::move(what);
  high_ = 0;
}

void ScratchArena::unbind() {
  release(0);
  base_ = nullptr;
  capacity_ = 0;
  bound_ = false;
  what_.clear();
}

void* ScratchArena::take(int64_t bytes) {
  const int64_t size = rounded(std::max<int64_t>(bytes, 0));
  if (!bound_) {
    auto* block = static_cast<std::byte*>(std::aligned_alloc(size_t(kAlign), size_t(std::max(size, kAlign))));
    if (!block) throw std::bad_alloc();
    heap_.push_back({used_, std::unique_ptr<std::byte, Free>(block)});
    used_ += size;
    high_ = std::max(high_, used_);
    return heap_.back().bytes.get();
  }
  if (used_ + size > capacity_)
    throw ScratchOverflow(cat_scratch(what_, bytes, used_, capacity_));
  void* p = base_ + used_;
  used_ += size;
  high_ = std::max(high_, used_);
  return p;
}

void ScratchArena::release(int64_t mark) {
  while (!heap_.empty() && heap_.back().mark >= mark) heap_.pop_back();
  if (mark < used_) used_ = mark;
}

ScratchArena& ScratchArena::of_this_thread() {
  thread_local ScratchArena arena;
  return arena;
}

// ---- Staging ------------------------------------------------------------------------------------

std::vector<const double*> Staging<double>::in(const std::vector<Src>& xs, int64_t n) const {
  std::vector<const double*> v;
  for (const Src& x : xs) v.push_back(in(x, n));
  return v;
}

std::vector<double*> Staging<double>::out(const std::vector<Dst>& ys, int64_t n) const {
  std::vector<double*> v;
  for (const Dst& y : ys) v.push_back(out(y, n));
  return v;
}

Staging<float>::Staging(const char* kernel)
    : kernel_(kernel), arena_(ScratchArena::of_this_thread()), mark_(arena_.mark()) {}

Staging<float>::~Staging() { arena_.release(mark_); }

const float* Staging<float>::in(Src x, int64_t n) {
  if (!x.data || x.dtype == DType::f32) return static_cast<const float*>(x.data);
  LFC_KERNEL_CHECK(x.dtype == DType::bf16, kernel_, ": an f32 kernel got an operand of dtype ", dtypeName(x.dtype));
  float* copy = arena_.take<float>(n);
  floatFromBf16(copy, static_cast<const bf16*>(x.data), n);
  return copy;
}

float* Staging<float>::out(Dst y, int64_t n) {
  if (!y.data || y.dtype == DType::f32) return static_cast<float*>(y.data);
  LFC_KERNEL_CHECK(y.dtype == DType::bf16, kernel_, ": an f32 kernel got an output of dtype ", dtypeName(y.dtype));
  float* copy = arena_.take<float>(n);
  floatFromBf16(copy, static_cast<const bf16*>(y.data), n);
  pending_.push_back({y, copy, n});
  return copy;
}

std::vector<const float*> Staging<float>::in(const std::vector<Src>& xs, int64_t n) {
  std::vector<const float*> v;
  for (const Src& x : xs) v.push_back(in(x, n));
  return v;
}

std::vector<float*> Staging<float>::out(const std::vector<Dst>& ys, int64_t n) {
  std::vector<float*> v;
  for (const Dst& y : ys) v.push_back(out(y, n));
  return v;
}

void Staging<float>::store() {
  for (const Pending& p : pending_) bf16FromFloat(static_cast<bf16*>(p.dst.data), p.values, p.n);
  pending_.clear();
}

}  // namespace lfc::cpu
