// CBLAS (OpenBLAS) behind one overloaded gemm, for the kernels' .cc files only.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <algorithm>

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

// C (M, N) = alpha · op(A) · op(B) + beta · C, row-major with leading dimensions lda, ldb, ldc;
// op(A) is (M, K) (A stored (K, M) when transA), op(B) is (K, N) (B stored (N, K) when transB).
// Empty products are handled here (CBLAS rejects some of them): K = 0 only scales C by beta.
template <typename Real>
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, Real alpha, const Real* A,
          int64_t lda, const Real* B, int64_t ldb, Real beta, Real* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == Real(0) ? Real(0) : beta * C[i * ldc + j];
    return;
  }
  serial_openblas();
  const CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans, tb = transB ? CblasTrans : CblasNoTrans;
  const bool alongM = M >= N;  // tiles of rows of C, or of columns
  const int64_t side = alongM ? M : N;
  const int64_t tiles = std::min({M * N * K / kGemmTileMacs, kGemmTiles, side / kGemmTileAlign});
  if (tiles <= 1) {
    gemm_raw(ta, tb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
    return;
  }
  const int64_t tile = ((side + tiles - 1) / tiles + kGemmTileAlign - 1) / kGemmTileAlign * kGemmTileAlign;
  parallelFor(side, tile, [&](int64_t b, int64_t e) {
    if (alongM)  // C[b:e] = op(A)[b:e] · op(B)
      gemm_raw(ta, tb, int(e - b), int(N), int(K), alpha, transA ? A + b : A + b * lda, int(lda), B, int(ldb),
               beta, C + b * ldc, int(ldc));
    else  // C[:, b:e] = op(A) · op(B)[:, b:e]
      gemm_raw(ta, tb, int(M), int(e - b), int(K), alpha, A, int(lda), transB ? B + b * ldb : B + b, int(ldb),
               beta, C + b, int(ldc));
  });
}

}  // namespace lfc::cpu::blas
