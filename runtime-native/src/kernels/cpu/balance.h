// ViT data-parallel balance (DESIGN.md "Parallel topology", --use-vit-dp-balance): the sizes of a
// microbatch's images, the deterministic rule that spreads the images of a group of ranks by
// cost, and the row moves around the exchange (rows picked by index, and their gradient).
//
// A microbatch's patches are numbered by image: segments (N) holds each patch's image index,
// images contiguous and in index order (as patchify writes them). P ranks, I image slots per rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// sizes (I) = patches of image i, 0 past the last image. Throws KernelError on a segment outside
// [0, I) or images out of order.
void image_sizes(int32_t* sizes, const int32_t* segments, int64_t N, int64_t I);

// The assignment of the group's images (all_sizes (P·I), rank p's sizes at p·I): cost of an image
// = patches²; images by cost descending, then global index p·I + i; each to the rank with the
// least total cost so far among the ranks whose patch rows stay ≤ capacity (ties to the lower
// rank). When some image fits nowhere, every image stays with its own rank. dest (P·I) = the rank
// that encodes image (p, i), −1 for an empty slot. Returns the images whose dest is not their own.
int64_t balance_assign(int32_t* dest, const int32_t* all_sizes, int64_t P, int64_t I, int64_t capacity);

// What rank r does with the assignment, for its own patches (N, segments as above):
//   send (P)          patch rows to each rank
//   order (N)         its patch rows in send order: by destination, then image, then patch
//   back (P)          visual tokens it returns to each rank (patches it receives from p / merge)
//   inverse (N/merge) for each own visual token, its row among the tokens that come back (they
//                     return in send order)
// Returns the images of the group encoded away from their own rank. Throws KernelError when the
// sizes of rank r disagree with its segments or an image is not a whole number of merge blocks.
int64_t vit_balance_route(int32_t* send, int32_t* order, int32_t* back, int32_t* inverse,
                          const int32_t* all_sizes, const int32_t* segments, int64_t N, int64_t P,
                          int64_t I, int64_t rank, int64_t merge, int64_t capacity);

// y (N) = segments + rank·stride where segments ≥ 0, −1 kept. Throws on a segment ≥ stride.
void segment_offset(int32_t* y, const int32_t* segments, int64_t N, int64_t rank, int64_t stride);

// y (M, row bytes) = x (N, row bytes) [index (M)]; any element type. Throws on an index outside [0, N).
void gather_rows(std::byte* y, const std::byte* x, const int32_t* index, int64_t M, int64_t N,
                 int64_t rowBytes);
// dx (N, H) OVERWRITTEN: zero, then dy (M, H)[i] added at row index[i].
template <typename Real>
void scatter_rows(Real* dx, const Real* dy, const int32_t* index, int64_t M, int64_t N, int64_t H);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
void scatter_rows(Dst dx, Src dy, const int32_t* index, int64_t M, int64_t N, int64_t H);

}  // namespace lfc::cpu
