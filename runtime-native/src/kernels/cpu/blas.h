// CBLAS (OpenBLAS) behind one overloaded gemm, for the kernels' .cc files only.
#pragma once

#include <cblas.h>

#include <cstdint>

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
  gemm_raw(transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, int(M), int(N),
           int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

}  // namespace lfc::cpu::blas
