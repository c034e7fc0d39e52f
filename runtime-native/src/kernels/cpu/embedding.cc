#include "embedding.h"

#include <algorithm>
#include <cstring>

namespace lfc::cpu {

namespace {
void check_ids(const char* kernel, const int32_t* ids, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; t++)
    LFC_KERNEL_CHECK(ids[t] >= 0 && ids[t] < V, kernel, ": ids[", t, "] = ", ids[t],
                     " is outside the table of ", V, " rows");
}
void check_vocab(const char* kernel, const int32_t* ids, int64_t T, int64_t first, int64_t V, int64_t vocab) {
  LFC_KERNEL_CHECK(first >= 0 && V >= 0 && first + V <= vocab, kernel, ": rows [", first, ", ", first + V,
                   ") are outside the vocabulary of ", vocab);
  for (int64_t t = 0; t < T; t++)
    LFC_KERNEL_CHECK(ids[t] >= 0 && ids[t] < vocab, kernel, ": ids[", t, "] = ", ids[t],
                     " is outside the vocabulary of ", vocab);
}
}  // namespace

template <typename Real>
void embedding_forward(Real* y, const int32_t* ids, const Real* table, int64_t T, int64_t V, int64_t H) {
  check_ids("embedding_forward", ids, T, V);
  for (int64_t t = 0; t < T; t++) {
    const Real* row = table + int64_t(ids[t]) * H;  // (H)
    std::copy(row, row + H, y + t * H);
  }
}

template <typename Real>
void embedding_backward(Real* dtable, const Real* dy, const int32_t* ids, int64_t T, int64_t V, int64_t H) {
  check_ids("embedding_backward", ids, T, V);
  for (int64_t t = 0; t < T; t++) {
    Real* drow = dtable + int64_t(ids[t]) * H;  // (H)
    const Real* dyt = dy + t * H;               // (H)
    for (int64_t i = 0; i < H; i++) drow[i] += dyt[i];
  }
}

template <typename Real>
void embedding_bag_forward(Real* y, const int32_t* ids, const Real* weights, const Real* table, int64_t T,
                           int64_t K, int64_t V, int64_t H) {
  check_ids("embedding_bag_forward", ids, T * K, V);
  for (int64_t t = 0; t < T; t++) {
    Real* yt = y + t * H;  // (H)
    std::fill(yt, yt + H, Real(0));
    for (int64_t k = 0; k < K; k++) {
      const Real w = weights[t * K + k];
      const Real* row = table + int64_t(ids[t * K + k]) * H;  // (H)
      for (int64_t i = 0; i < H; i++) yt[i] += w * row[i];
    }
  }
}

template <typename Real>
void embedding_bag_backward(Real* dtable, const Real* dy, const int32_t* ids, const Real* weights, int64_t T,
                            int64_t K, int64_t V, int64_t H) {
  check_ids("embedding_bag_backward", ids, T * K, V);
  for (int64_t t = 0; t < T; t++) {
    const Real* dyt = dy + t * H;  // (H)
    for (int64_t k = 0; k < K; k++) {
      const Real w = weights[t * K + k];
      Real* drow = dtable + int64_t(ids[t * K + k]) * H;  // (H)
      for (int64_t i = 0; i < H; i++) drow[i] += w * dyt[i];
    }
  }
}

template <typename Real>
void embedding_shard_forward(Real* y, const int32_t* ids, const Real* table, int64_t T, int64_t V, int64_t H,
                             int64_t first, int64_t vocab) {
  check_vocab("embedding_shard_forward", ids, T, first, V, vocab);
  for (int64_t t = 0; t < T; t++) {
    const int64_t row = int64_t(ids[t]) - first;
    Real* yt = y + t * H;  // (H)
    if (row < 0 || row >= V) {
      std::fill(yt, yt + H, Real(0));
      continue;
    }
    const Real* src = table + row * H;  // (H)
    std::copy(src, src + H, yt);
  }
}

template <typename Real>
void embedding_shard_backward(Real* dtable, const Real* dy, const int32_t* ids, int64_t T, int64_t V,
                              int64_t H, int64_t first, int64_t vocab) {
  check_vocab("embedding_shard_backward", ids, T, first, V, vocab);
  for (int64_t t = 0; t < T; t++) {
    const int64_t row = int64_t(ids[t]) - first;
    if (row < 0 || row >= V) continue;
    Real* drow = dtable + row * H;  // (H)
    const Real* dyt = dy + t * H;   // (H)
    for (int64_t i = 0; i < H; i++) drow[i] += dyt[i];
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t);
template void embedding_backward<float>(float*, const float*, const int32_t*, int64_t, int64_t, int64_t);
template void embedding_backward<double>(double*, const double*, const int32_t*, int64_t, int64_t, int64_t);

#define LFC_INSTANTIATE_EMBEDDING_BAG(Real)                                                          \
  template void embedding_bag_forward<Real>(Real*, const int32_t*, const Real*, const Real*, int64_t, int64_t, \
                                            int64_t, int64_t);                                             \
  template void embedding_bag_backward<Real>(Real*, const Real*, const int32_t*, const Real*, int64_t,        \
                                             int64_t, int64_t, int64_t);
LFC_INSTANTIATE_EMBEDDING_BAG(float)
LFC_INSTANTIATE_EMBEDDING_BAG(double)

template void embedding_shard_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t,
                                             int64_t, int64_t);
template void embedding_shard_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t,
                                              int64_t, int64_t);
template void embedding_shard_backward<float>(float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                                              int64_t, int64_t);
template void embedding_shard_backward<double>(double*, const double*, const int32_t*, int64_t, int64_t,
                                               int64_t, int64_t, int64_t);

// ---- by storage dtype ---------------------------------------------------------------------------

namespace {
bool any_bf16(Dst y, Src x) { return y.dtype == DType::bf16 || x.dtype == DType::bf16; }
}  // namespace

void embedding_forward(Dst y, const int32_t* ids, Src table, int64_t T, int64_t V, int64_t H) {
  if (any_bf16(y, table)) {
    runs_in_f64("embedding_forward", {y, table});  // the dtype checks
    check_ids("embedding_forward", ids, T, V);
    for (int64_t t = 0; t < T; t++) convert(y.at(t * H), table.at(int64_t(ids[t]) * H), H);
    return;
  }
  by_dtype("embedding_forward", {y, table},
           [&](auto& s) { embedding_forward(s.out(y, T * H), ids, s.in(table, V * H), T, V, H); });
}

void embedding_backward(Dst dtable, Src dy, const int32_t* ids, int64_t T, int64_t V, int64_t H) {
  by_dtype("embedding_backward", {dtable, dy},
           [&](auto& s) { embedding_backward(s.out(dtable, V * H), s.in(dy, T * H), ids, T, V, H); });
}

void embedding_bag_forward(Dst y, const int32_t* ids, Src weights, Src table, int64_t T, int64_t K, int64_t V,
                           int64_t H) {
  by_dtype("embedding_bag_forward", {y, weights, table}, [&](auto& s) {
    embedding_bag_forward(s.out(y, T * H), ids, s.in(weights, T * K), s.in(table, V * H), T, K, V, H);
  });
}

void embedding_bag_backward(Dst dtable, Src dy, const int32_t* ids, Src weights, int64_t T, int64_t K, int64_t V,
                            int64_t H) {
  by_dtype("embedding_bag_backward", {dtable, dy, weights}, [&](auto& s) {
    embedding_bag_backward(s.out(dtable, V * H), s.in(dy, T * H), ids, s.in(weights, T * K), T, K, V, H);
  });
}

void embedding_shard_forward(Dst y, const int32_t* ids, Src table, int64_t T, int64_t V, int64_t H, int64_t first,
                             int64_t vocab) {
  if (any_bf16(y, table)) {
    runs_in_f64("embedding_shard_forward", {y, table});
    check_vocab("embedding_shard_forward", ids, T, first, V, vocab);
    for (int64_t t = 0; t < T; t++) {
      const int64_t row = int64_t(ids[t]) - first;
      if (row >= 0 && row < V) convert(y.at(t * H), table.at(row * H), H);
      else std::memset(y.at(t * H).data, 0, size_t(H * dtypeBytes(y.dtype)));  // +0 in every float dtype
    }
    return;
  }
  by_dtype("embedding_shard_forward", {y, table}, [&](auto& s) {
    embedding_shard_forward(s.out(y, T * H), ids, s.in(table, V * H), T, V, H, first, vocab);
  });
}

void embedding_shard_backward(Dst dtable, Src dy, const int32_t* ids, int64_t T, int64_t V, int64_t H,
                              int64_t first, int64_t vocab) {
  by_dtype("embedding_shard_backward", {dtable, dy}, [&](auto& s) {
    embedding_shard_backward(s.out(dtable, V * H), s.in(dy, T * H), ids, T, V, H, first, vocab);
  });
}

}  // namespace lfc::cpu
