// Mixture of experts: router (softmax + top-k), permutation of token rows into expert order and
// back, and the load-balancing auxiliary loss. The expert FFNs are grouped_linear (linear.h) and
// swiglu (activation.h) on the permuted rows.
//
// An assignment a = t·k + j is token t's j-th choice. Under an expert capacity (Megatron's
// --moe-expert-capacity-factor with drop policy position) an assignment can be dropped: its
// row_of is −1 and it reads and writes no row. Expert ids outside [0, E) and row indices outside
// [0, N) other than −1 throw KernelError.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// probs (T, E) = softmax(logits (T, E)) per row; experts (T, k) = the k most probable experts in
// descending probability, ties to the lower expert index; weights (T, k) = their probabilities,
// renormalized to sum 1 if normalize (HF's norm_topk_prob).
template <typename Real>
void router_topk_forward(Real* probs, Real* weights, int32_t* experts, const Real* logits, int64_t T,
                         int64_t E, int64_t k, bool normalize = true);
// dlogits (T, E), OVERWRITTEN, from dprobs (T, E) and dweights (T, k), the selection held fixed.
// Either gradient may be null (no gradient reached that output). probs, weights, experts are the
// forward's outputs.
template <typename Real>
void router_topk_backward(Real* dlogits, const Real* dprobs, const Real* dweights, const Real* probs,
                          const Real* weights, const int32_t* experts, int64_t T, int64_t E, int64_t k,
                          bool normalize = true);

// weights (T, k) = probs (T, E) at experts (T, k), renormalized to sum 1 per token if normalize: the forward's
// weights again, computed exactly as router_topk_forward does (its backward needs them). Throws
// KernelError on an expert outside [0, E).
template <typename Real>
void router_topk_weights(Real* weights, const Real* probs, const int32_t* experts, int64_t T, int64_t E, int64_t k,
                         bool normalize = true);
// rows (N, H): x (T, H) rows grouped by expert e = 0 … E−1, and within an expert in assignment
// order (stable in token order); counts (E) rows per expert; row_of (T·k) the row of assignment a.
// capacity ≥ 1: expert e keeps `capacity` of its assignments and drops the rest (row_of −1), so
// counts[e] = min(assignments to e, capacity): its first ones in assignment order (Megatron's drop
// policy position), or with priority (T·k; the routing weights: policy probs) those of highest
// priority, ties to the earlier assignment; capacity < 0: none dropped. The kept rows come first,
// each expert's in assignment order; rows past Σ counts are zero. Σ counts > N throws KernelError.
template <typename Real>
void moe_permute_forward(Real* rows, int32_t* counts, int32_t* row_of, const Real* x,
                         const int32_t* experts, int64_t T, int64_t H, int64_t k, int64_t E, int64_t N,
                         int64_t capacity, const Real* priority = nullptr);
// dx (T, H)[t] = Σ_j drows (N, H)[row_of[t·k + j]] over the kept assignments (row_of ≥ 0).
// Overwrites dx.
template <typename Real>
void moe_permute_backward(Real* dx, const Real* drows, const int32_t* row_of, int64_t T, int64_t H,
                          int64_t k, int64_t N);

// y (T, H)[t] = Σ_j weights (T, k)[t, j] · rows (N, H)[row_of (T·k)[t·k + j]] over the kept
// assignments: a dropped one adds nothing, and the kept weights are not renormalized.
template <typename Real>
void moe_unpermute_forward(Real* y, const Real* rows, const int32_t* row_of, const Real* weights,
                           int64_t T, int64_t k, int64_t N, int64_t H);
// drows (N, H) OVERWRITTEN: weights[a]·dy[t] at row_of[a], 0 at rows no assignment reads;
// dweights (T, k) OVERWRITTEN: dy[t] · rows[row_of[a]], 0 for a dropped assignment.
template <typename Real>
void moe_unpermute_backward(Real* drows, Real* dweights, const Real* dy, const Real* rows,
                            const int32_t* row_of, const Real* weights, int64_t T, int64_t k, int64_t N,
                            int64_t H);

// coeff · E · Σ_e f_e · P_e over the n tokens with segments (T) ≥ 0: f_e = (assignments to e)/(n·k)
// (a count, no gradient), P_e = mean of probs (T, E)[·, e]. n = 0 gives 0.
template <typename Real>
Real moe_aux_loss_forward(const Real* probs, const int32_t* experts, const int32_t* segments, int64_t T,
                          int64_t E, int64_t k, double coeff);
// dprobs (T, E) += dloss · coeff · E · f_e / n on non-padding rows: ACCUMULATES, so that it adds to
// the gradient router_topk's probs already got (or to a zeroed buffer).
template <typename Real>
void moe_aux_loss_backward(Real* dprobs, Real dloss, const int32_t* experts, const int32_t* segments,
                           int64_t T, int64_t E, int64_t k, double coeff);

// ---- expert parallelism: P ranks of the ep group, L = E/P local experts per rank --------------------

// rank_counts (P)[p] = Σ counts (E)[p·E/P … (p+1)·E/P − 1]: the rows a rank sends to each rank of the
// group. E must be a multiple of P; a negative count throws.
void moe_rank_counts(int32_t* rank_counts, const int32_t* counts, int64_t E, int64_t P);
// local (L)[l] = Σ_p counts (P, L)[p, l]: the rows of each local expert after the dispatch.
void moe_local_counts(int32_t* local, const int32_t* counts, int64_t P, int64_t L);
// y (N, H): the row blocks of x (N, H) reordered. Forward: x holds blocks (p, l) in p-major order,
// counts (P, L)[p, l] rows each, and y holds them l-major (expert l's rows from every source p, in
// order of p). inverse: x holds l-major blocks and y p-major. Rows past Σ counts are copied
// unchanged, so the op is a permutation and its backward is the same op with inverse flipped.
// Throws if a count is negative or Σ counts > N.
template <typename Real>
void moe_sort_chunks(Real* y, const Real* x, const int32_t* counts, int64_t P, int64_t L, int64_t N, int64_t H,
                     bool inverse);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
void router_topk_forward(Dst probs, Dst weights, int32_t* experts, Src logits, int64_t T, int64_t E, int64_t k,
                         bool normalize = true);
void router_topk_backward(Dst dlogits, Src dprobs, Src dweights, Src probs, Src weights, const int32_t* experts,
                          int64_t T, int64_t E, int64_t k, bool normalize = true);
void router_topk_weights(Dst weights, Src probs, const int32_t* experts, int64_t T, int64_t E, int64_t k,
                         bool normalize = true);
void moe_permute_forward(Dst rows, int32_t* counts, int32_t* row_of, Src x, const int32_t* experts, int64_t T,
                         int64_t H, int64_t k, int64_t E, int64_t N, int64_t capacity, Src priority);
void moe_permute_backward(Dst dx, Src drows, const int32_t* row_of, int64_t T, int64_t H, int64_t k, int64_t N);
void moe_unpermute_forward(Dst y, Src rows, const int32_t* row_of, Src weights, int64_t T, int64_t k, int64_t N,
                           int64_t H);
void moe_unpermute_backward(Dst drows, Dst dweights, Src dy, Src rows, const int32_t* row_of, Src weights,
                            int64_t T, int64_t k, int64_t N, int64_t H);
double moe_aux_loss_forward(Src probs, const int32_t* experts, const int32_t* segments, int64_t T, int64_t E,
                            int64_t k, double coeff);
void moe_aux_loss_backward(Dst dprobs, double dloss, const int32_t* experts, const int32_t* segments, int64_t T,
                           int64_t E, int64_t k, double coeff);
void moe_sort_chunks(Dst y, Src x, const int32_t* counts, int64_t P, int64_t L, int64_t N, int64_t H,
                     bool inverse);

}  // namespace lfc::cpu
