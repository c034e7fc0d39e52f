#include "data/microbatch.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/hash.h"

namespace lfc {

namespace {

// a · b, or −1 when it overflows int64 (sizes from a batch file may be anything)
constexpr int64_t kMaxPatches = int64_t(1) << 40;

int64_t sizeProduct(int64_t a, int64_t b) {
  int64_t p;
  return __builtin_mul_overflow(a, b, &p) ? -1 : p;
}

}  // namespace

Patches patchify(const std::vector<Image>& images, int64_t P, int64_t merge, int64_t temporal) {
  Patches out;
  out.width = 3 * temporal * P * P;
  const int64_t unit = P * merge;
  for (size_t i = 0; i < images.size(); i++) {
    const Image& im = images[i];
    if (im.height <= 0 || im.width <= 0 || im.height % unit || im.width % unit)
      throw RuntimeError(cat("image ", i, " is ", im.height, "×", im.width,
                             " pixels; both sides must be positive multiples of ", unit,
                             " (patch ", P, " × merge ", merge, ")"));
    const int64_t values = sizeProduct(3, sizeProduct(im.height, im.width));
    if (values < 0 || int64_t(im.pixels.size()) != values)
      throw RuntimeError(cat("image ", i, " has ", im.pixels.size(), " pixel values, [3, ", im.height,
                             ", ", im.width, "] needs ", values < 0 ? "more than 2^63" : std::to_string(values)));
    out.count += (im.height / P) * (im.width / P);
    out.grids.push_back(Grid{1, im.height / P, im.width / P});
  }
  out.values.resize(size_t(out.count * out.width));
  int64_t n = 0;
  for (size_t i = 0; i < images.size(); i++) {
    const Image& im = images[i];
    const int64_t H = im.height, W = im.width;
    const int64_t bh = H / unit, bw = W / unit;
    for (int64_t br = 0; br < bh; br++)
      for (int64_t bc = 0; bc < bw; bc++)
        for (int64_t di = 0; di < merge; di++)
          for (int64_t dj = 0; dj < merge; dj++, n++) {
            const int64_t r = br * merge + di, c = bc * merge + dj;
            float* dst = out.values.data() + n * out.width;  // (3, temporal, P, P)
            for (int64_t ch = 0; ch < 3; ch++)
              for (int64_t t = 0; t < temporal; t++)
                for (int64_t pr = 0; pr < P; pr++)
                  for (int64_t pc = 0; pc < P; pc++)
                    *dst++ = im.pixels[size_t((ch * H + r * P + pr) * W + c * P + pc)];
          }
  }
  return out;
}

Patches patchesOf(const Microbatch& mb, const VisionSpec& spec, bool valuesRequired) {
  if (!mb.images.empty()) {
    if (!mb.pixelValues.empty() || !mb.grids.empty())
      throw RuntimeError("give images or pixel values with their grids, not both");
    if (spec.channels != 3)
      throw RuntimeError(cat("images are RGB; the model takes ", spec.channels, " channels"));
    return patchify(mb.images, spec.patchSize, spec.mergeSize, spec.temporalPatch);
  }
  Patches out;
  out.width = spec.patchWidth();
  out.grids = mb.grids;
  for (size_t i = 0; i < mb.grids.size(); i++) {
    const Grid& g = mb.grids[i];
    if (g.t < 1 || g.h < 1 || g.w < 1)
      throw RuntimeError(cat("image_grid_thw[", i, "] = (", g.t, ", ", g.h, ", ", g.w, ") must be positive"));
    // patches of every image, bounded so that their values can be counted (no batch holds 2^40)
    const int64_t n = sizeProduct(g.t, sizeProduct(g.h, g.w));
    if (n < 0 || n > kMaxPatches || (out.count += n) > kMaxPatches)
      throw RuntimeError(cat("image_grid_thw[", i, "] = (", g.t, ", ", g.h, ", ", g.w, ") brings the patches past ",
                             kMaxPatches));
  }
  if (!valuesRequired && mb.pixelValues.empty()) return out;  // the grids alone: sizes, no pixels
  if (int64_t(mb.pixelValues.size()) != out.count * out.width)
    throw RuntimeError(cat("pixel_values has ", mb.pixelValues.size(), " values; its grids give ", out.count,
                           " patches of ", out.width, " (", spec.channels, " channels · ", spec.temporalPatch,
                           " frames · ", spec.patchSize, "²)"));
  out.values = mb.pixelValues;
  return out;
}

namespace {

constexpr float kLevels[2] = {0.15f, 0.85f};
constexpr double kNoiseStd = 0.03;

float colour(int c, int channel) { return kLevels[(c >> (2 - channel)) & 1]; }

// Stream tags, so that the draws of different purposes never share a key.
constexpr uint64_t kSynthTag = 0x73796E7468ull;  // "synth"
constexpr uint64_t kNoiseTag = 0x6E6F697365ull;  // "noise"

Image drawImage(int64_t H, int64_t W, int bg, int sq, int quad, uint64_t noiseKey) {
  Image im;
  im.height = H;
  im.width = W;
  im.pixels.resize(size_t(3 * H * W));
  const int64_t s = std::min(H, W) / 2;
  const int64_t top = (quad / 2) * (H / 2) + (H / 2 - s) / 2;
  const int64_t left = (quad % 2) * (W / 2) + (W / 2 - s) / 2;
  for (int ch = 0; ch < 3; ch++)
    for (int64_t y = 0; y < H; y++)
      for (int64_t x = 0; x < W; x++) {
        const bool inSquare = y >= top && y < top + s && x >= left && x < left + s;
        const size_t i = size_t((ch * H + y) * W + x);
        const double v = colour(inSquare ? sq : bg, ch) + kNoiseStd * hash::normal(noiseKey, i);
        im.pixels[i] = float(std::clamp(v, 0.0, 1.0));
      }
  return im;
}

}  // namespace

Microbatch synthesize(const SynthArgs& a) {
  if (a.vocab <= kFillerToken)
    throw RuntimeError(cat("synthesize: vocab ", a.vocab, " leaves no filler tokens (they start at ",
                           kFillerToken, ")"));
  if (a.seqLength <= 0) throw RuntimeError(cat("synthesize: seqLength ", a.seqLength, " must be positive"));
  const uint64_t key = hash::combine(
      hash::combine(hash::combine(hash::splitmix64(kSynthTag), a.seed), uint64_t(a.step)),
      uint64_t(a.globalMicrobatch));
  const int64_t unit = a.patchSize * a.mergeSize;
  Microbatch mb;
  int64_t visual = 0;
  for (int64_t sample = 0;; sample++) {
    hash::Stream r{hash::combine(key, uint64_t(sample))};
    const int64_t ia = 1 + r.below(4), ib = 1 + r.below(4);
    const int bg = int(r.below(8));
    const int sq = int((bg + 1 + r.below(7)) % 8);
    const int quad = int(r.below(4));
    const int64_t fillerLen = 3 + r.below(6);
    const int64_t stride = 1 + r.below(6);
    const int64_t start = r.below(a.vocab - kFillerToken);
    const int64_t nv = ia * ib;
    const int64_t len = nv + 3 + fillerLen;
    if (int64_t(mb.tokens.size()) + len > a.seqLength) break;
    if (a.maxVisualTokens >= 0 && visual + nv > a.maxVisualTokens) break;
    visual += nv;

    std::vector<int32_t> toks(size_t(nv), kPlaceholderToken);
    toks.push_back(kBackgroundToken + bg);
    toks.push_back(kSquareToken + sq);
    toks.push_back(kQuadrantToken + quad);
    for (int64_t i = 0; i < fillerLen; i++)
      toks.push_back(int32_t(kFillerToken + (start + i * stride) % (a.vocab - kFillerToken)));
    for (size_t i = 0; i < toks.size(); i++) {
      const int32_t next = i + 1 < toks.size() ? toks[i + 1] : kPadToken;
      const bool text = next != kPadToken && next != kPlaceholderToken;
      mb.tokens.push_back(toks[i]);
      mb.labels.push_back(text ? next : 0);
      mb.lossMask.push_back(text ? 1 : 0);
      mb.positions.push_back(int32_t(i));
      mb.segments.push_back(int32_t(sample));
    }
    mb.images.push_back(drawImage(unit * ia, unit * ib, bg, sq, quad,
                                  hash::combine(hash::combine(key, kNoiseTag), uint64_t(sample))));
    mb.grids.push_back(Grid{1, a.mergeSize * ia, a.mergeSize * ib});
  }
  const size_t pad = size_t(a.seqLength) - mb.tokens.size();
  mb.tokens.insert(mb.tokens.end(), pad, kPadToken);
  mb.labels.insert(mb.labels.end(), pad, 0);
  mb.lossMask.insert(mb.lossMask.end(), pad, 0);
  mb.positions.insert(mb.positions.end(), pad, 0);
  mb.segments.insert(mb.segments.end(), pad, -1);
  if (a.positionRows == 3)
    mb.positions = ropeIndex(mb.tokens, mb.segments, mb.grids, kPlaceholderToken, a.mergeSize);
  else if (a.positionRows != 1)
    throw RuntimeError(cat("synthesize: positionRows ", a.positionRows, " must be 1 or 3"));
  mb.grids.clear();  // the images carry them
  return mb;
}

std::vector<uint8_t> captionMask(const Microbatch& mb) {
  if (!mb.captionMask.empty()) return mb.captionMask;
  std::vector<uint8_t> out(mb.labels.size());
  for (size_t i = 0; i < out.size(); i++)
    out[i] = mb.labels[i] >= kBackgroundToken && mb.labels[i] <= kCaptionLast ? 1 : 0;
  return out;
}

}  // namespace lfc
