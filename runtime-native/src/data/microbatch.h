// Microbatches: the data of one packed sequence (tokens, labels, loss mask, positions, segments
// and its images), the cutting of images into patches, and the synthetic task of
// shared/reference/tiny-vlm.md.
//
// Token map of the synthetic task (the same as test/reference/tiny_vlm.py):
//   0 padding   1 image placeholder (one per visual token)
//   2 + c       background colour c ∈ 0..7        (2..9)
//   10 + c      square colour c ∈ 0..7, ≠ background (10..17)
//   18 + q      quadrant of the square: 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right
//   22..25      unused caption values
//   26 + …      filler: an arithmetic sequence 26 + (start + i·stride) mod (vocab − 26)
// Colour c is the RGB-cube corner (L[c>>2 & 1], L[c>>1 & 1], L[c & 1]) with L = {0.15, 0.85}.
#pragma once

#include <cstdint>
#include <vector>

#include "data/vision.h"

namespace lfc {

constexpr int32_t kPadToken = 0;
constexpr int32_t kPlaceholderToken = 1;
constexpr int32_t kBackgroundToken = 2;  // + colour
constexpr int32_t kSquareToken = 10;     // + colour
constexpr int32_t kQuadrantToken = 18;   // + quadrant
constexpr int32_t kCaptionLast = 25;
constexpr int32_t kFillerToken = 26;

struct Image {
  int64_t height = 0, width = 0;
  std::vector<float> pixels;  // (3, height, width)
};

// The batch contract (docs/qwen-vl.md): a microbatch's images come either as images [3, H, W]
// (cut into patches by the runtime) or already as patches with each image's grid.
struct Microbatch {
  std::vector<int32_t> tokens;     // (S)
  std::vector<int32_t> labels;     // (S) next token of the same sample if it is text, else 0
  std::vector<uint8_t> lossMask;   // (S) 1 where the label is a text token
  std::vector<int32_t> positions;  // (S) index within the sample, or (3, S) M-RoPE ids t, h, w; 0 on padding
  std::vector<int32_t> segments;   // (S) sample index, −1 on padding
  std::vector<Image> images;
  std::vector<float> pixelValues;  // (N, C·T·P·P) patches, when images is empty
  std::vector<Grid> grids;         // each image's grid in patches (with pixelValues)
  std::vector<int32_t> windowSegments;  // (N) given window ids (checked); empty: derived
  int32_t imageTokenId = -1;            // the placeholder id; −1: the model's
  std::vector<uint8_t> captionMask;  // (S) 1 where the label is a caption token; empty: derived
};

// The patches of a microbatch's images, in image order, each image's patches by merge blocks.
struct Patches {
  int64_t count = 0;                   // Np
  int64_t width = 0;                   // C·T·P·P values per patch
  std::vector<float> values;           // (Np, C·T·P·P), each patch in (channel, time, row, col) order
  std::vector<Grid> grids;             // each image's grid
};

// Cuts images (each [3, H, W], H and W multiples of P·merge) into P×P patches ordered by
// merge×merge blocks: block rows top to bottom, block columns left to right, inside a block row
// by row (top-left, top-right, bottom-left, bottom-right for merge 2). A still image is repeated
// `temporal` times in time: a patch holds (channel, time, row, col). Throws RuntimeError naming the
// image on a bad size.
Patches patchify(const std::vector<Image>& images, int64_t P, int64_t merge, int64_t temporal = 1);

// The microbatch's patches: its images cut (patchify), or its pixelValues checked against its
// grids and the spec's patch width. Throws RuntimeError naming what disagrees. Where the values
// are not required (a program that does not encode this microbatch), grids with no pixelValues
// give the patch count and grids with no values: the data loader decodes images only where a
// rank encodes them.
Patches patchesOf(const Microbatch& mb, const VisionSpec& spec, bool valuesRequired = true);

struct SynthArgs {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t globalMicrobatch = 0;
  int64_t seqLength = 0;
  int64_t vocab = 0;
  int64_t maxVisualTokens = -1;  // −1: no limit
  int64_t patchSize = 4;
  int64_t mergeSize = 2;
  int64_t positionRows = 1;  // 3: M-RoPE position ids (ropeIndex) instead of the index in the sample
};

// The synthetic task: a pure function of (seed, step, global microbatch). Samples (image
// placeholders, 3 caption tokens, a filler of 3–8 tokens) are packed until the next one would
// not fit seqLength (or maxVisualTokens); padding fills the rest. Images are
// (P·merge·a) × (P·merge·b) pixels, a, b ∈ 1..4, so a sample has a·b visual tokens.
Microbatch synthesize(const SynthArgs& a);

// mb.captionMask when given, else 1 at positions whose label is a caption token (2..25).
std::vector<uint8_t> captionMask(const Microbatch& mb);

}  // namespace lfc
