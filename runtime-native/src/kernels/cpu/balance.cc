#include "balance.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

namespace lfc::cpu {

void image_sizes(int32_t* sizes, const int32_t* segments, int64_t N, int64_t I) {
  ScratchScope scratch;
  int32_t* count = scratch.take<int32_t>(I);  // (I)
  std::fill(count, count + I, 0);
  int64_t last = -1;
  for (int64_t n = 0; n < N; n++) {
    const int64_t s = segments[n];
    LFC_KERNEL_CHECK(s >= 0 && s < I, "image_sizes: patch ", n, " has image index ", s, ", outside [0, ", I, ")");
    LFC_KERNEL_CHECK(s == last || s == last + 1, "image_sizes: patch ", n, " has image index ", s,
                     " after ", last, " (images must be contiguous, in index order)");
    last = s;
    count[s]++;
  }
  std::copy(count, count + I, sizes);
}

int64_t balance_assign(int32_t* dest, const int32_t* all_sizes, int64_t P, int64_t I, int64_t capacity) {
  ScratchScope scratch;
  int64_t* images = scratch.take<int64_t>(P * I);  // (≤ P·I): global indices of the non-empty slots
  int64_t count = 0;
  for (int64_t g = 0; g < P * I; g++) {
    LFC_KERNEL_CHECK(all_sizes[g] >= 0, "balance_assign: image ", g % I, " of rank ", g / I, " has ",
                     all_sizes[g], " patches");
    dest[g] = all_sizes[g] > 0 ? int32_t(g / I) : -1;
    if (all_sizes[g] > 0) images[count++] = g;
  }
  const auto cost = [&](int64_t g) { return int64_t(all_sizes[g]) * all_sizes[g]; };
  std::stable_sort(images, images + count, [&](int64_t a, int64_t b) { return cost(a) > cost(b); });
  int64_t* load = scratch.take<int64_t>(P);  // (P)
  int64_t* rows = scratch.take<int64_t>(P);  // (P)
  std::fill(load, load + P, 0);
  std::fill(rows, rows + P, 0);
  int32_t* chosen = scratch.take<int32_t>(P * I);  // (≤ P·I)
  for (int64_t j = 0; j < count; j++) {
    const int64_t n = all_sizes[images[j]];
    int64_t best = -1;
    for (int64_t q = 0; q < P; q++)
      if (rows[q] + n <= capacity && (best < 0 || load[q] < load[best])) best = q;
    if (best < 0) return 0;  // no room anywhere: every image stays home (dest as set above)
    chosen[j] = int32_t(best);
    load[best] += cost(images[j]);
    rows[best] += n;
  }
  int64_t moved = 0;
  for (int64_t j = 0; j < count; j++) {
    dest[images[j]] = chosen[j];
    moved += chosen[j] != images[j] / I;
  }
  return moved;
}

int64_t vit_balance_route(int32_t* send, int32_t* order, int32_t* back, int32_t* inverse,
                          const int32_t* all_sizes, const int32_t* segments, int64_t N, int64_t P,
                          int64_t I, int64_t rank, int64_t merge, int64_t capacity) {
  LFC_KERNEL_CHECK(rank >= 0 && rank < P, "vit_balance_route: rank ", rank, " outside the group of ", P);
  LFC_KERNEL_CHECK(merge >= 1 && N % merge == 0, "vit_balance_route: ", N, " patches are not a multiple of ",
                   merge, " (patches per visual token)");
  // this rank's images: start row and patches, checked against its segments
  const int32_t* mine = all_sizes + rank * I;
  ScratchScope scratch;
  int64_t* start = scratch.take<int64_t>(I);  // (I)
  std::fill(start, start + I, 0);
  int64_t total = 0;
  for (int64_t i = 0; i < I; i++) {
    start[i] = total;
    LFC_KERNEL_CHECK(mine[i] % merge == 0, "vit_balance_route: image ", i, " has ", mine[i],
                     " patches, not whole merge blocks of ", merge);
    total += mine[i];
  }
  LFC_KERNEL_CHECK(total == N, "vit_balance_route: the sizes of rank ", rank, " add up to ", total,
                   " patches, its segments have ", N);
  for (int64_t i = 0; i < I; i++)
    for (int64_t n = start[i]; n < start[i] + mine[i]; n++)
      LFC_KERNEL_CHECK(segments[n] == i, "vit_balance_route: patch ", n, " has image index ", segments[n],
                       ", the sizes say ", i);

  int32_t* dest = scratch.take<int32_t>(P * I);  // (P·I)
  const int64_t moved = balance_assign(dest, all_sizes, P, I, capacity);
  std::fill(send, send + P, 0);
  std::fill(back, back + P, 0);
  for (int64_t g = 0; g < P * I; g++) {
    if (dest[g] < 0) continue;
    if (g / I == rank) send[dest[g]] += all_sizes[g];
    if (dest[g] == rank) back[g / I] += int32_t(all_sizes[g] / merge);
  }
  // send order: by destination, then image; a token comes back at its position in that order
  int64_t at = 0;
  for (int64_t q = 0; q < P; q++)
    for (int64_t i = 0; i < I; i++) {
      if (dest[rank * I + i] != q) continue;
      for (int64_t n = start[i]; n < start[i] + mine[i]; n++) {
        order[at] = int32_t(n);
        if (n % merge == 0) inverse[n / merge] = int32_t(at / merge);
        at++;
      }
    }
  return moved;
}

void segment_offset(int32_t* y, const int32_t* segments, int64_t N, int64_t rank, int64_t stride) {
  for (int64_t n = 0; n < N; n++) {
    const int32_t s = segments[n];
    LFC_KERNEL_CHECK(s < stride, "segment_offset: segment ", s, " at row ", n, " is not below the stride ", stride);
    y[n] = s < 0 ? s : int32_t(s + rank * stride);
  }
}

void gather_rows(std::byte* y, const std::byte* x, const int32_t* index, int64_t M, int64_t N,
                 int64_t rowBytes) {
  for (int64_t i = 0; i < M; i++) {
    const int64_t j = index[i];
    LFC_KERNEL_CHECK(j >= 0 && j < N, "gather_rows: index ", j, " at ", i, " outside [0, ", N, ")");
    std::memcpy(y + i * rowBytes, x + j * rowBytes, size_t(rowBytes));
  }
}

template <typename Real>
void scatter_rows(Real* dx, const Real* dy, const int32_t* index, int64_t M, int64_t N, int64_t H) {
  for (int64_t i = 0; i < M; i++)
    LFC_KERNEL_CHECK(index[i] >= 0 && index[i] < N, "scatter_rows: index ", index[i], " at ", i,
                     " outside [0, ", N, ")");
  std::fill(dx, dx + N * H, Real(0));
  for (int64_t i = 0; i < M; i++) {
    Real* row = dx + int64_t(index[i]) * H;
    const Real* src = dy + i * H;
    for (int64_t h = 0; h < H; h++) row[h] += src[h];
  }
}

template void scatter_rows<float>(float*, const float*, const int32_t*, int64_t, int64_t, int64_t);
template void scatter_rows<double>(double*, const double*, const int32_t*, int64_t, int64_t, int64_t);

// ---- by storage dtype ---------------------------------------------------------------------------

void scatter_rows(Dst dx, Src dy, const int32_t* index, int64_t M, int64_t N, int64_t H) {
  by_dtype("scatter_rows", {dx, dy}, [&](auto& s) { scatter_rows(s.out(dx, N * H), s.in(dy, M * H), index, M, N, H); });
}

}  // namespace lfc::cpu
