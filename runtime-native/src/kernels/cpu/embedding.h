// Token embedding: rows of a table at integer ids.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// y (T, H) = table (V, H) [ids (T)]. Throws KernelError if an id is outside [0, V).
template <typename Real>
void embedding_forward(Real* y, const int32_t* ids, const Real* table, int64_t T, int64_t V, int64_t H);
// dtable (V, H) [ids[t]] += dy (T, H) [t]: ACCUMULATES (repeated ids sum).
template <typename Real>
void embedding_backward(Real* dtable, const Real* dy, const int32_t* ids, int64_t T, int64_t V, int64_t H);

// Weighted bag of K rows per output (the bilinear interpolation of a position table, K = 4):
// y (T, H)[t] = Σ_k weights (T, K)[t, k] · table (V, H)[ids (T, K)[t, k]].
template <typename Real>
void embedding_bag_forward(Real* y, const int32_t* ids, const Real* weights, const Real* table, int64_t T,
                           int64_t K, int64_t V, int64_t H);
// dtable[ids[t, k]] += weights[t, k] · dy[t]: ACCUMULATES.
template <typename Real>
void embedding_bag_backward(Real* dtable, const Real* dy, const int32_t* ids, const Real* weights, int64_t T,
                            int64_t K, int64_t V, int64_t H);

// Vocab-parallel (Megatron's VocabParallelEmbedding, before its all-reduce): the table (V, H) holds
// rows [first, first + V) of a vocabulary of `vocab` ids. y (T, H)[t] = table[ids[t] − first] for
// the ids inside that block, 0 for the others. Throws KernelError if an id is outside [0, vocab).
template <typename Real>
void embedding_shard_forward(Real* y, const int32_t* ids, const Real* table, int64_t T, int64_t V, int64_t H,
                             int64_t first, int64_t vocab);
// dtable (V, H)[ids[t] − first] += dy (T, H)[t] for the ids inside the block: ACCUMULATES; the other
// tokens contribute nothing.
template <typename Real>
void embedding_shard_backward(Real* dtable, const Real* dy, const int32_t* ids, int64_t T, int64_t V,
                              int64_t H, int64_t first, int64_t vocab);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
// The forwards gather rows: with a bf16 operand each row is converted on its own (staging the
// table would copy all V·H values for T rows). dtable is f32 in mixed precision plans (the fp32
// main gradient); a bf16 dtable works, through an f32 copy of the whole table.
void embedding_forward(Dst y, const int32_t* ids, Src table, int64_t T, int64_t V, int64_t H);
void embedding_backward(Dst dtable, Src dy, const int32_t* ids, int64_t T, int64_t V, int64_t H);
void embedding_bag_forward(Dst y, const int32_t* ids, Src weights, Src table, int64_t T, int64_t K, int64_t V,
                           int64_t H);
void embedding_bag_backward(Dst dtable, Src dy, const int32_t* ids, Src weights, int64_t T, int64_t K, int64_t V,
                            int64_t H);
void embedding_shard_forward(Dst y, const int32_t* ids, Src table, int64_t T, int64_t V, int64_t H, int64_t first,
                             int64_t vocab);
void embedding_shard_backward(Dst dtable, Src dy, const int32_t* ids, int64_t T, int64_t V, int64_t H,
                              int64_t first, int64_t vocab);

}  // namespace lfc::cpu
