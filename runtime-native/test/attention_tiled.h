// The attention kernel before the flash-style one, kept for kernel_check --bench only
// (attention_tiled.cc): same arguments and semantics as lfc::cpu::attention_forward/backward.
#pragma once

#include <cstdint>

namespace lfc::cpu::tiled {

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal);
template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal);

}  // namespace lfc::cpu::tiled
