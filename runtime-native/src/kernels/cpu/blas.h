// CBLAS (OpenBLAS) behind one overloaded gemm and a batch of them, for the kernels' .cc files only.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/thread_pool.h"

namespace lfc::cpu::blas {

inline void gemm_raw(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                     const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm_raw(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
                     const double* A, int lda, const double* B, int ldb, double beta, double* C,
                     int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// lfc runs OpenBLAS at one thread and spreads a gemm over the kernel pool itself: OpenBLAS's own
// threads give other bits at another thread count (its Haswell sgemm does, measured), and would
// run beside the pool's. A gemm of at least kGemmTileMacs multiply-adds is cut along the longer
// side of C into at most kGemmTiles tiles of a size that depends on (M, N, K) alone, each tile one
// single-threaded OpenBLAS call on a pool thread: the same tiles, and so the same bits, at any
// thread count (core/thread_pool.h's rule). A gemm inside a pooled block runs its tiles inline.
inline constexpr int64_t kGemmTileMacs = int64_t(1) << 20;
inline constexpr int64_t kGemmTiles = 8;
inline constexpr int64_t kGemmTileAlign = 16;  // rows or columns of a tile: a multiple of this

inline void serial_openblas() {
  static const bool once = (openblas_set_num_threads(1), true);
  (void)once;
}

// One gemm: C (M, N) = alpha · op(A) · op(B) + beta · C, row-major with leading dimensions lda,
// ldb, ldc; op(A) is (M, K) (A stored (K, M) when transA), op(B) is (K, N) (B stored (N, K) when
// transB).
template <typename Real>
struct GemmCall {
  bool transA, transB;
  int64_t M, N, K;
  Real alpha;
  const Real* A;
  int64_t lda;
  const Real* B;
  int64_t ldb;
  Real beta;
  Real* C;
  int64_t ldc;
};

// How a gemm is cut: `count` tiles of `tile` rows (alongM) or columns of C; count 1: one call.
struct Tiling {
  bool alongM;
  int64_t tile, count;
};

inline Tiling tiling(int64_t M, int64_t N, int64_t K) {
  const bool alongM = M >= N;  // tiles of rows of C, or of columns
  const int64_t side = alongM ? M : N;
  const int64_t tiles = std::min({M * N * K / kGemmTileMacs, kGemmTiles, side / kGemmTileAlign});
  if (tiles <= 1) return {alongM, side, 1};
  const int64_t tile = ((side + tiles - 1) / tiles + kGemmTileAlign - 1) / kGemmTileAlign * kGemmTileAlign;
  return {alongM, tile, (side + tile - 1) / tile};
}

// Empty products are handled here (CBLAS rejects some of them): K = 0 only scales C by beta.
// Returns whether the call still has a product to run.
template <typename Real>
bool prepare(const GemmCall<Real>& g) {
  if (g.M == 0 || g.N == 0) return false;
  if (g.K == 0) {
    if (g.beta != Real(1))
      for (int64_t i = 0; i < g.M; i++)
        for (int64_t j = 0; j < g.N; j++)
          g.C[i * g.ldc + j] = g.beta == Real(0) ? Real(0) : g.beta * g.C[i * g.ldc + j];
    return false;
  }
  serial_openblas();
  return true;
}

// tile t of the gemm cut as `how`: one single-threaded OpenBLAS call
template <typename Real>
void run_tile(const GemmCall<Real>& g, const Tiling& how, int64_t t) {
  const CBLAS_TRANSPOSE ta = g.transA ? CblasTrans : CblasNoTrans, tb = g.transB ? CblasTrans : CblasNoTrans;
  const int64_t side = how.alongM ? g.M : g.N;
  const int64_t b = t * how.tile, e = std::min(side, b + how.tile);
  if (how.count == 1)
    gemm_raw(ta, tb, int(g.M), int(g.N), int(g.K), g.alpha, g.A, int(g.lda), g.B, int(g.ldb), g.beta, g.C,
             int(g.ldc));
  else if (how.alongM)  // C[b:e] = op(A)[b:e] · op(B)
    gemm_raw(ta, tb, int(e - b), int(g.N), int(g.K), g.alpha, g.transA ? g.A + b : g.A + b * g.lda, int(g.lda),
             g.B, int(g.ldb), g.beta, g.C + b * g.ldc, int(g.ldc));
  else  // C[:, b:e] = op(A) · op(B)[:, b:e]
    gemm_raw(ta, tb, int(g.M), int(e - b), int(g.K), g.alpha, g.A, int(g.lda), g.transB ? g.B + b * g.ldb : g.B + b,
             int(g.ldb), g.beta, g.C + b, int(g.ldc));
}

template <typename Real>
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, Real alpha, const Real* A,
          int64_t lda, const Real* B, int64_t ldb, Real beta, Real* C, int64_t ldc) {
  const GemmCall<Real> g{transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
  if (!prepare(g)) return;
  const Tiling how = tiling(M, N, K);
  if (how.count == 1) return run_tile(g, how, 0);
  parallelFor(how.count, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) run_tile(g, how, t);
  });
}

// Several independent gemms (a grouped GEMM: one per expert) as one pool job: every tile of every
// gemm is a block, so small gemms run side by side and large ones still split. Each tile is the
// call gemm would make for it, so the bits are gemm's, one gemm after another, at any thread count.
template <typename Real>
void gemm_batch(const std::vector<GemmCall<Real>>& calls) {
  std::vector<std::pair<int32_t, int32_t>> items;  // (call, tile)
  std::vector<Tiling> how(calls.size());
  for (size_t c = 0; c < calls.size(); c++) {
    if (!prepare(calls[c])) continue;
    how[c] = tiling(calls[c].M, calls[c].N, calls[c].K);
    for (int64_t t = 0; t < how[c].count; t++) items.emplace_back(int32_t(c), int32_t(t));
  }
  parallelFor(int64_t(items.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      const auto [c, t] = items[size_t(i)];
      run_tile(calls[size_t(c)], how[size_t(c)], t);
    }
  });
}

}  // namespace lfc::cpu::blas
