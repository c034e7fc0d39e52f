#include "data/vision.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lfc {

namespace {

void checkGrid(const Grid& g, size_t i, int64_t merge) {
  if (g.t != 1)
    throw RuntimeError(cat("image ", i, " has ", g.t, " frames; only still images (t = 1) are supported"));
  if (g.h <= 0 || g.w <= 0 || g.h % merge || g.w % merge)
    throw RuntimeError(cat("image ", i, " has a grid of ", g.h, "×", g.w, " patches; both sides must be positive ",
                           "multiples of the merge size ", merge));
}

// torch.linspace(0, end, steps) in float32: the first half counts up from 0, the second down
// from end, with the same float step
std::vector<float> linspace(float end, int64_t steps) {
  std::vector<float> out(static_cast<size_t>(steps), 0.f);
  if (steps == 1) {
    out[0] = 0.f;
    return out;
  }
  const float step = end / float(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; i++)
    out[size_t(i)] = i < half ? float(i) * step : end - float(steps - 1 - i) * step;
  return out;
}

// visits the patches of image grids in merge-block order: f(image, row, col)
template <typename F>
void forEachPatch(const std::vector<Grid>& grids, int64_t merge, F&& f) {
  for (size_t i = 0; i < grids.size(); i++) {
    const Grid& g = grids[i];
    for (int64_t br = 0; br < g.h / merge; br++)
      for (int64_t bc = 0; bc < g.w / merge; bc++)
        for (int64_t di = 0; di < merge; di++)
          for (int64_t dj = 0; dj < merge; dj++) f(i, br * merge + di, bc * merge + dj);
  }
}

}  // namespace

std::vector<int32_t> windowSegments(const std::vector<Grid>& grids, int64_t merge, int64_t windowMerged) {
  std::vector<int32_t> out;
  std::vector<int64_t> base(grids.size() + 1, 0);
  for (size_t i = 0; i < grids.size(); i++) {
    checkGrid(grids[i], i, merge);
    const int64_t hm = grids[i].h / merge, wm = grids[i].w / merge;
    base[i + 1] = base[i] + ((hm + windowMerged - 1) / windowMerged) * ((wm + windowMerged - 1) / windowMerged);
  }
  forEachPatch(grids, merge, [&](size_t i, int64_t r, int64_t c) {
    const int64_t across = (grids[i].w / merge + windowMerged - 1) / windowMerged;
    out.push_back(int32_t(base[i] + (r / merge / windowMerged) * across + (c / merge / windowMerged)));
  });
  return out;
}

VisionInputs visionInputs(const std::vector<Grid>& grids, const VisionSpec& spec) {
  VisionInputs v;
  const int64_t merge = spec.mergeSize;
  for (size_t i = 0; i < grids.size(); i++) checkGrid(grids[i], i, merge);
  forEachPatch(grids, merge, [&](size_t i, int64_t r, int64_t c) {
    v.imageSegments.push_back(int32_t(i));
    v.rows.push_back(int32_t(r));
    v.cols.push_back(int32_t(c));
    v.positions.push_back(int32_t(r));
    v.positions.push_back(int32_t(c));
  });
  if (spec.windowMerged > 0) v.windowSegments = windowSegments(grids, merge, spec.windowMerged);
  if (spec.tableSide > 0) {
    // Qwen3-VL's fast_pos_embed_interpolate: the n×n table sampled at linspace(0, n−1, h) ×
    // linspace(0, n−1, w), corners floor and min(floor + 1, n − 1)
    const int64_t n = spec.tableSide;
    std::vector<std::vector<float>> hs, ws;
    for (const Grid& g : grids) {
      hs.push_back(linspace(float(n - 1), g.h));
      ws.push_back(linspace(float(n - 1), g.w));
    }
    forEachPatch(grids, merge, [&](size_t i, int64_t r, int64_t c) {
      const float hi = hs[i][size_t(r)], wi = ws[i][size_t(c)];
      const int64_t h0 = int64_t(hi), w0 = int64_t(wi);
      const int64_t h1 = std::min(h0 + 1, n - 1), w1 = std::min(w0 + 1, n - 1);
      const float dh = hi - float(h0), dw = wi - float(w0);
      for (int64_t id : {h0 * n + w0, h0 * n + w1, h1 * n + w0, h1 * n + w1}) v.tableIds.push_back(int32_t(id));
      for (float w : {(1.f - dh) * (1.f - dw), (1.f - dh) * dw, dh * (1.f - dw), dh * dw}) v.tableWeights.push_back(w);
    });
  }
  return v;
}

std::vector<int32_t> ropeIndex(const std::vector<int32_t>& tokens, const std::vector<int32_t>& segments,
                               const std::vector<Grid>& grids, int32_t imageToken, int64_t merge) {
  const size_t S = tokens.size();
  if (segments.size() != S)
    throw RuntimeError(cat("position ids: segments has ", segments.size(), " elements, tokens has ", S));
  std::vector<int32_t> out(3 * S, 0);  // rows t, h, w
  size_t image = 0;
  int64_t next = 0;
  for (size_t i = 0; i < S;) {
    if (segments[i] < 0) {  // padding
      i++;
      continue;
    }
    if (i == 0 || segments[i] != segments[i - 1]) next = 0;  // a new sample
    if (tokens[i] != imageToken) {
      for (size_t r = 0; r < 3; r++) out[r * S + i] = int32_t(next);
      next++;
      i++;
      continue;
    }
    if (image >= grids.size())
      throw RuntimeError(cat("position ids: placeholder at token ", i, " but only ", grids.size(), " images"));
    checkGrid(grids[image], image, merge);
    const int64_t hm = grids[image].h / merge, wm = grids[image].w / merge;
    for (int64_t k = 0; k < hm * wm; k++) {
      const size_t at = i + size_t(k);
      if (at >= S || tokens[at] != imageToken || segments[at] != segments[i])
        throw RuntimeError(cat("position ids: image ", image, " (", hm, "×", wm, " merged tokens) needs ", hm * wm,
                               " placeholders from token ", i, "; token ", at,
                               at < S ? " is not one of its sample's placeholders" : " is past the end"));
      out[at] = int32_t(next);
      out[S + at] = int32_t(next + k / wm);
      out[2 * S + at] = int32_t(next + k % wm);
    }
    next += std::max(hm, wm);
    i += size_t(hm * wm);
    image++;
  }
  if (image != grids.size())
    throw RuntimeError(cat("position ids: ", grids.size(), " images but placeholders for ", image));
  return out;
}

}  // namespace lfc
