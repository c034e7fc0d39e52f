// Rotary position embedding, rotate-half form, with position sections (multimodal RoPE).
//
// Frequency j ∈ [0, d/2) has inv_freq_j = theta^(−2j/d); the pair (x_j, x_{j+d/2}) of every head
// rotates by the angle p·inv_freq_j:
//   y_j = x_j·cos − x_{j+d/2}·sin,   y_{j+d/2} = x_{j+d/2}·cos + x_j·sin.
// sections (P) splits the d/2 frequencies into P consecutive groups (sizes summing to d/2); group s
// takes p = positions[t, s]. P = 1 with sections = {d/2} is plain RoPE.
// The layout says which position column each frequency takes, and the frequencies:
//   sectioned    (Qwen2.5-VL's M-RoPE) as above;
//   interleaved  (Qwen3-VL's M-RoPE, P = 3) inv_freq_j = theta^(−2j/d); column 1 for j ≡ 1 (mod 3)
//                with j < 3·sections[1], column 2 for j ≡ 2 (mod 3) with j < 3·sections[2], else 0;
//   per_axis     (the Qwen-VL ViTs' 2-D RoPE) group s restarts its frequencies: the k-th of group
//                s (size n_s) is theta^(−k/n_s), i.e. theta^(−4k/d) for two equal groups.
// Throws KernelError if d is odd or the sections do not sum to d/2.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

enum class RopeLayout { sectioned, interleaved, per_axis };

// y (T, nh, d) = rope(x (T, nh, d)); positions (T, P), sections (P). y may be x (in place).
template <typename Real>
void rope_forward(Real* y, const Real* x, const int32_t* positions, const int32_t* sections, int64_t P,
                  int64_t T, int64_t nh, int64_t d, double theta,
                  RopeLayout layout = RopeLayout::sectioned);
// dx (T, nh, d) = rotation of dy by −angle (the transpose of the forward). dx may be dy. Overwrites.
template <typename Real>
void rope_backward(Real* dx, const Real* dy, const int32_t* positions, const int32_t* sections,
                   int64_t P, int64_t T, int64_t nh, int64_t d, double theta,
                  RopeLayout layout = RopeLayout::sectioned);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
void rope_forward(Dst y, Src x, const int32_t* positions, const int32_t* sections, int64_t P, int64_t T,
                  int64_t nh, int64_t d, double theta, RopeLayout layout = RopeLayout::sectioned);
void rope_backward(Dst dx, Src dy, const int32_t* positions, const int32_t* sections, int64_t P, int64_t T,
                   int64_t nh, int64_t d, double theta, RopeLayout layout = RopeLayout::sectioned);

}  // namespace lfc::cpu
