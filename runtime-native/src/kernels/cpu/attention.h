// Scaled dot-product attention over packed segments, with grouped-query heads.
//
//   q (T, nh, d), k (T, nkv, d), v (T, nkv, d), segments (T) int32, −1 = padding.
// Token i attends to token j iff segments[i] == segments[j] ≥ 0 and (not causal or j ≤ i); a
// padding token attends only to itself (its output is its own v). Query head h reads KV head
// h / (nh / nkv). scores = scale · q·k.
//
// forward writes out (T, nh, d) and saves lse (T, nh), the log-sum-exp of each row of scores;
// backward OVERWRITES dq, dk, dv. Throws KernelError if nh is not a multiple of nkv.
//
// The optimized version works segment by segment (contiguous runs of one id), in row blocks whose
// columns stop at the causal diagonal, with CBLAS gemms; masked blocks are never computed. A
// segment id that occurs in two separate runs (never the case for packed samples) falls back to
// the reference. lfc::cpu::ref is the naive O(T²) loop.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal);
// dq (T, nh, d), dk, dv (T, nkv, d) from dout (T, nh, d) and the forward's inputs, out and lse.
template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
// lse in f32 (f64 on the f64 path): the softmax is computed in f32 whatever q, k, v store.
void attention_forward(Dst out, Dst lse, Src q, Src k, Src v, const int32_t* segments, int64_t T, int64_t nh,
                       int64_t nkv, int64_t d, double scale, bool causal);
void attention_backward(Dst dq, Dst dk, Dst dv, Src dout, Src q, Src k, Src v, Src out, Src lse,
                        const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale,
                        bool causal);

namespace ref {
template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal);
template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal);
}  // namespace ref

}  // namespace lfc::cpu
