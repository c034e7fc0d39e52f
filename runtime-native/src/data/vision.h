// What the vision encoder reads of a microbatch, derived from its patches and each image's grid
// (docs/qwen-vl.md, "The batch contract"): the image, row and column of every patch, its
// attention window, its rows of an interpolated position table; and the decoder's M-RoPE
// position ids (t, h, w) of Hugging Face's get_rope_index.
#pragma once

#include <cstdint>
#include <vector>

namespace lfc {

// An image's grid in patches: t frames (1 for a still image), h rows, w columns.
struct Grid {
  int64_t t = 1, h = 0, w = 0;
};

// How the encoder sees images (from the model config).
struct VisionSpec {
  int64_t patchSize = 4;
  int64_t temporalPatch = 1;  // frames per patch (a still image is repeated this many times)
  int64_t channels = 3;
  int64_t mergeSize = 2;
  int64_t windowMerged = 0;  // window side in merged tokens (0: no window attention)
  int64_t tableSide = 0;     // side of the interpolated position table (0: none)
  int64_t patchWidth() const { return channels * temporalPatch * patchSize * patchSize; }
};

// Per-patch inputs of the encoder, in patch order (images in order, each in merge-block order).
struct VisionInputs {
  std::vector<int32_t> imageSegments;     // (N) image index
  std::vector<int32_t> rows, cols;        // (N) patch row / column in its image
  std::vector<int32_t> positions;         // (N, 2) row, column: the 2-D rotary positions
  std::vector<int32_t> windowSegments;    // (N) window id, unique over the microbatch (windowMerged > 0)
  std::vector<int32_t> tableIds;          // (N, 4) rows of the position table (tableSide > 0)
  std::vector<float> tableWeights;        // (N, 4) their bilinear weights
};

// Throws RuntimeError naming the image when a grid does not fit the spec (t ≠ 1: video is not
// supported; h, w not multiples of the merge size).
VisionInputs visionInputs(const std::vector<Grid>& grids, const VisionSpec& spec);

// The window of each patch: merged token (R, C) of image i is in window
// base_i + (R div m)·⌈Wm/m⌉ + (C div m), m = windowMerged, Wm = w / merge, base_i the windows of
// the images before it.
std::vector<int32_t> windowSegments(const std::vector<Grid>& grids, int64_t merge, int64_t windowMerged);

// Position ids (3, S) of get_rope_index, per packed sample (segments; ids restart at 0 in each
// sample, padding (segment −1) gets 0): text continues one by one, an image of merged grid
// (hm, wm) starting at id s gives its token (r, c) t = s, h = s + r, w = s + c, and the text
// after it continues at s + max(hm, wm). Images are taken in order, one per run of hm·wm
// placeholders. Throws RuntimeError when the placeholders and the grids disagree.
std::vector<int32_t> ropeIndex(const std::vector<int32_t>& tokens, const std::vector<int32_t>& segments,
                               const std::vector<Grid>& grids, int32_t imageToken, int64_t merge);

}  // namespace lfc
