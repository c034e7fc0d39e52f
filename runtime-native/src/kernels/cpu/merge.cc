#include "merge.h"

#include <algorithm>

namespace lfc::cpu {

namespace {
void check_placeholders(const char* kernel, const int32_t* tokens, int32_t placeholder, int64_t T,
                        int64_t Nv) {
  const int64_t found = std::count(tokens, tokens + T, placeholder);
  LFC_KERNEL_CHECK(found == Nv, kernel, ": ", found, " placeholder tokens (id ", placeholder,
                   ") in the text but ", Nv, " visual rows");
}
}  // namespace

template <typename Real>
void merge_visual_forward(Real* y, const Real* text, const Real* visual, const int32_t* tokens,
                          int32_t placeholder, MergeMode mode, int64_t T, int64_t Nv, int64_t H) {
  check_placeholders("merge_visual_forward", tokens, placeholder, T, Nv);
  if (y != text) std::copy(text, text + T * H, y);
  for (int64_t t = 0, i = 0; t < T; t++) {
    if (tokens[t] != placeholder) continue;
    const Real* vi = visual + i++ * H;  // (H)
    Real* yt = y + t * H;               // (H)
    if (mode == MergeMode::Replace) std::copy(vi, vi + H, yt);
    else for (int64_t c = 0; c < H; c++) yt[c] += vi[c];
  }
}

template <typename Real>
void merge_visual_backward(Real* dtext, Real* dvisual, const Real* dy, const int32_t* tokens,
                           int32_t placeholder, MergeMode mode, int64_t T, int64_t Nv, int64_t H) {
  check_placeholders("merge_visual_backward", tokens, placeholder, T, Nv);
  for (int64_t t = 0, i = 0; t < T; t++) {
    const Real* dyt = dy + t * H;  // (H)
    Real* dtt = dtext + t * H;     // (H)
    if (tokens[t] == placeholder) {
      std::copy(dyt, dyt + H, dvisual + i++ * H);  // before dtext, which may alias dy
      if (mode == MergeMode::Replace) {
        std::fill(dtt, dtt + H, Real(0));
        continue;
      }
    }
    if (dtt != dyt) std::copy(dyt, dyt + H, dtt);
  }
}

#define LFC_INSTANTIATE_MERGE(Real)                                                              \
  template void merge_visual_forward<Real>(Real*, const Real*, const Real*, const int32_t*,      \
                                           int32_t, MergeMode, int64_t, int64_t, int64_t);       \
  template void merge_visual_backward<Real>(Real*, Real*, const Real*, const int32_t*, int32_t,  \
                                            MergeMode, int64_t, int64_t, int64_t);
LFC_INSTANTIATE_MERGE(float)
LFC_INSTANTIATE_MERGE(double)

// ---- by storage dtype ---------------------------------------------------------------------------

void merge_visual_forward(Dst y, Src text, Src visual, const int32_t* tokens, int32_t placeholder,
                          MergeMode mode, int64_t T, int64_t Nv, int64_t H) {
  by_dtype("merge_visual_forward", {y, text, visual}, [&](auto& s) {
    merge_visual_forward(s.out(y, T * H), s.in(text, T * H), s.in(visual, Nv * H), tokens, placeholder, mode, T, Nv,
                         H);
  });
}

void merge_visual_backward(Dst dtext, Dst dvisual, Src dy, const int32_t* tokens, int32_t placeholder,
                           MergeMode mode, int64_t T, int64_t Nv, int64_t H) {
  by_dtype("merge_visual_backward", {dtext, dvisual, dy}, [&](auto& s) {
    merge_visual_backward(s.out(dtext, T * H), s.out(dvisual, Nv * H), s.in(dy, T * H), tokens, placeholder, mode, T,
                          Nv, H);
  });
}

}  // namespace lfc::cpu
