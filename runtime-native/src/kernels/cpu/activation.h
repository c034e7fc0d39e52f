// Elementwise ops over n values: GELU (tanh approximation, or exact), SwiGLU (silu(gate)·up), add.
// Every gradient here is of an activation and is OVERWRITTEN. Outputs may alias inputs in the
// forwards (y == x, y == a); the backwards read everything of an element before writing it.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
template <typename Real>
void gelu_forward(Real* y, const Real* x, int64_t n);
// dx = dy · gelu'(x)
template <typename Real>
void gelu_backward(Real* dx, const Real* dy, const Real* x, int64_t n);

// y = 0.5·x·(1 + erf(x/√2)), the exact GELU (PyTorch's nn.GELU())
template <typename Real>
void gelu_exact_forward(Real* y, const Real* x, int64_t n);
// dx = dy · (Φ(x) + x·φ(x))
template <typename Real>
void gelu_exact_backward(Real* dx, const Real* dy, const Real* x, int64_t n);

// y = gate·σ(gate) · up
template <typename Real>
void swiglu_forward(Real* y, const Real* gate, const Real* up, int64_t n);
// dgate = dy·up·σ(g)·(1 + g·(1 − σ(g)));  dup = dy·g·σ(g)
template <typename Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dy, const Real* gate, const Real* up, int64_t n);

// y = a + b
template <typename Real>
void add_forward(Real* y, const Real* a, const Real* b, int64_t n);
// da = dy, db = dy
template <typename Real>
void add_backward(Real* da, Real* db, const Real* dy, int64_t n);

// Pooled (core/thread_pool.h) in fixed blocks of kElementGrain elements, each ref's loop on its
// range: the same bits as ref at any thread count.
namespace ref {
template <typename Real>
void gelu_forward(Real* y, const Real* x, int64_t n);
template <typename Real>
void gelu_backward(Real* dx, const Real* dy, const Real* x, int64_t n);

template <typename Real>
void gelu_exact_forward(Real* y, const Real* x, int64_t n);
template <typename Real>
void gelu_exact_backward(Real* dx, const Real* dy, const Real* x, int64_t n);

template <typename Real>
void swiglu_forward(Real* y, const Real* gate, const Real* up, int64_t n);
template <typename Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dy, const Real* gate, const Real* up, int64_t n);

template <typename Real>
void add_forward(Real* y, const Real* a, const Real* b, int64_t n);
template <typename Real>
void add_backward(Real* da, Real* db, const Real* dy, int64_t n);
}  // namespace ref

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
void gelu_forward(Dst y, Src x, int64_t n);
void gelu_backward(Dst dx, Src dy, Src x, int64_t n);
void gelu_exact_forward(Dst y, Src x, int64_t n);
void gelu_exact_backward(Dst dx, Src dy, Src x, int64_t n);
void swiglu_forward(Dst y, Src gate, Src up, int64_t n);
void swiglu_backward(Dst dgate, Dst dup, Src dy, Src gate, Src up, int64_t n);
void add_forward(Dst y, Src a, Src b, int64_t n);
void add_backward(Dst da, Dst db, Src dy, int64_t n);

}  // namespace lfc::cpu
