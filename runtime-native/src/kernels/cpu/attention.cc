#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "storage.h"

namespace lfc::cpu {

namespace {

void check_heads(const char* kernel, int64_t nh, int64_t nkv) {
  LFC_KERNEL_CHECK(nkv > 0 && nh % nkv == 0, kernel, ": query heads ", nh,
                   " are not a multiple of KV heads ", nkv);
}

bool attends(const int32_t* segments, int64_t i, int64_t j, bool causal) {
  if (segments[i] < 0) return i == j;  // padding: only itself
  return segments[j] == segments[i] && (!causal || j <= i);
}

template <typename Real>
double dot(const Real* a, const Real* b, int64_t d) {
  double acc = 0;
  for (int64_t c = 0; c < d; c++) acc += double(a[c]) * double(b[c]);
  return acc;
}

// A maximal run of tokens [start, start + len) with one segment id.
struct Run {
  int64_t start, len;
  int32_t id;
};
static_assert(sizeof(Run) == 24, "compiler/plan/scratch.ts counts 24 bytes a run");

// The runs of segments (T) into runs (T: at most one a token), using ids (T) as scratch; how many,
// or −1 when a non-negative id occurs in two separate runs.
int64_t segment_runs(const int32_t* segments, int64_t T, Run* runs, int32_t* ids) {
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) {
    if (n == 0 || segments[t] != runs[n - 1].id) runs[n++] = {t, 0, segments[t]};
    runs[n - 1].len++;
  }
  int64_t m = 0;
  for (int64_t r = 0; r < n; r++)
    if (runs[r].id >= 0) ids[m++] = runs[r].id;
  std::sort(ids, ids + m);
  return std::adjacent_find(ids, ids + m) == ids + m ? n : -1;
}

// Segments that are not contiguous runs (attention windows in merge-block order): the tokens in a
// stable order by segment id, so that each segment is one run (its own order kept: causal masks
// mean the same), with the segment ids in that order. perm (T), sorted (T).
void sort_by_segment(const int32_t* segments, int64_t T, int64_t* perm, int32_t* sorted) {
  for (int64_t t = 0; t < T; t++) perm[t] = t;
  std::stable_sort(perm, perm + T, [&](int64_t a, int64_t b) { return segments[a] < segments[b]; });
  for (int64_t t = 0; t < T; t++) sorted[t] = segments[perm[t]];
}

// dst[t] = src[perm[t]] (gather) or dst[perm[t]] = src[t] (scatter), rows of w values
template <typename Real>
void permute_rows(Real* dst, const Real* src, const int64_t* perm, int64_t T, int64_t w, bool scatter) {
  for (int64_t t = 0; t < T; t++) {
    const Real* from = src + (scatter ? t : perm[t]) * w;
    std::copy(from, from + w, dst + (scatter ? perm[t] : t) * w);
  }
}

}  // namespace

// ---- reference: naive O(T²), double accumulators ---------------------------------------------

namespace ref {

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal) {
  check_heads("ref::attention_forward", nh, nkv);
  const int64_t g = nh / nkv;
  ScratchScope scratch;
  double* acc = scratch.take<double>(d);  // (d)
  for (int64_t i = 0; i < T; i++)
    for (int64_t h = 0; h < nh; h++) {
      const int64_t kvh = h / g;
      const Real* qi = q + (i * nh + h) * d;  // (d)
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < T; j++)
        if (attends(segments, i, j, causal)) m = std::max(m, scale * dot(qi, k + (j * nkv + kvh) * d, d));
      double sum = 0;
      for (int64_t j = 0; j < T; j++)
        if (attends(segments, i, j, causal)) sum += std::exp(scale * dot(qi, k + (j * nkv + kvh) * d, d) - m);
      const double l = m + std::log(sum);
      std::fill(acc, acc + d, 0.0);
      for (int64_t j = 0; j < T; j++) {
        if (!attends(segments, i, j, causal)) continue;
        const double p = std::exp(scale * dot(qi, k + (j * nkv + kvh) * d, d) - l);
        const Real* vj = v + (j * nkv + kvh) * d;  // (d)
        for (int64_t c = 0; c < d; c++) acc[c] += p * double(vj[c]);
      }
      for (int64_t c = 0; c < d; c++) out[(i * nh + h) * d + c] = Real(acc[c]);
      lse[i * nh + h] = Real(l);
    }
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal) {
  check_heads("ref::attention_backward", nh, nkv);
  const int64_t g = nh / nkv;
  ScratchScope scratch;
  double* dq_acc = scratch.take<double>(T * nh * d);   // (T, nh, d)
  double* dk_acc = scratch.take<double>(T * nkv * d);  // (T, nkv, d)
  double* dv_acc = scratch.take<double>(T * nkv * d);  // (T, nkv, d)
  std::fill(dq_acc, dq_acc + T * nh * d, 0.0);
  std::fill(dk_acc, dk_acc + T * nkv * d, 0.0);
  std::fill(dv_acc, dv_acc + T * nkv * d, 0.0);
  for (int64_t i = 0; i < T; i++)
    for (int64_t h = 0; h < nh; h++) {
      const int64_t kvh = h / g;
      const Real* qi = q + (i * nh + h) * d;      // (d)
      const Real* doi = dout + (i * nh + h) * d;  // (d)
      const double D = dot(doi, out + (i * nh + h) * d, d);
      for (int64_t j = 0; j < T; j++) {
        if (!attends(segments, i, j, causal)) continue;
        const Real* kj = k + (j * nkv + kvh) * d;  // (d)
        const Real* vj = v + (j * nkv + kvh) * d;  // (d)
        const double p = std::exp(scale * dot(qi, kj, d) - double(lse[i * nh + h]));
        const double ds = p * (dot(doi, vj, d) - D);  // d loss / d score
        for (int64_t c = 0; c < d; c++) {
          dv_acc[(j * nkv + kvh) * d + c] += p * double(doi[c]);
          dq_acc[(i * nh + h) * d + c] += scale * ds * double(kj[c]);
          dk_acc[(j * nkv + kvh) * d + c] += scale * ds * double(qi[c]);
        }
      }
    }
  std::transform(dq_acc, dq_acc + T * nh * d, dq, [](double x) { return Real(x); });
  std::transform(dk_acc, dk_acc + T * nkv * d, dk, [](double x) { return Real(x); });
  std::transform(dv_acc, dv_acc + T * nkv * d, dv, [](double x) { return Real(x); });
}

}  // namespace ref

namespace {

// ---- optimized: flash-style, online softmax, pooled over (head, block) ------------------------
//
// Tokens are cut into blocks of kBlock (the last one short). A query block I and a key block J
// form a tile of scores; a tile whose every entry is masked (past the causal diagonal, or no
// segment id in common) is never computed, one whose every entry is visible skips the mask.
// Within a tile the products are register-tiled loops (tile_gemm) on the block's own thread: a
// pooled block never calls a GEMM (core/thread_pool.h).
//
//   forward, one pool block per (head h, query block I): for each visible key block J, in order,
//     S = scale · Q_I K_Jᵀ, masked entries −∞; the running max m and sum l of each row are
//     updated (online softmax), O_I is rescaled by exp(m_old − m_new) and gains exp(S − m) V_J;
//     at the end O_I /= l and lse = m + log l.
//   backward (FlashAttention-2's recomputation: P = exp(S − lse), D = rowsum(dO ∘ O),
//   dS = scale · P ∘ (dO Vᵀ − D)), in two pooled passes so that every output row has one writer:
//     pass 1, one pool block per (KV head, key block J): dK_J, dV_J summed over the group's query
//       heads and the visible query blocks, in order (dV += Pᵀ dO, dK += dSᵀ Q);
//     pass 2, one pool block per (head h, query block I): dQ_I = Σ_J dS K_J, in order of J.
//   Recomputing S and dO Vᵀ in pass 2 costs 7 tile products where 5 would do, and buys outputs
//   that are the same bits at any thread count, without partial buffers.
// Every sum runs in a fixed order over fixed blocks, so the results do not depend on the thread
// count (the determinism rule of core/thread_pool.h).

constexpr int64_t kBlock = 64;   // query rows and key columns of a tile
constexpr int64_t kDChunk = 64;  // head-dim entries of K or V transposed at a time (a tile's Kᵀ)

// The tile loops are templates on NR, the C columns of a register tile, and always inlined into
// one caller per ISA (run_tasks_v4/v3/v2 below), so that each copy is compiled for its ISA.
#if defined(__GNUC__)
#define LFC_TILE inline __attribute__((always_inline))
#else
#define LFC_TILE inline
#endif

// exp(x) in float for the softmax: Cody–Waite reduction to 2ⁿ · e^r, |r| ≤ ln2/2, and Cephes'
// degree-6 polynomial for e^r (about 1 ulp); 0 below −87.3 (so exp(−∞) = 0), exp(0) = 1 exactly.
// Branch-free, so the loops over a row vectorize.
LFC_TILE float exp_softmax(float x) {
  const bool tiny = x < -87.3f;
  x = std::min(std::max(x, -87.3f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round(x / ln2)
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.f;
  const int32_t bits = (int32_t(n) + 127) << 23;  // 2ⁿ
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return tiny ? 0.f : e * two_n;
}
LFC_TILE double exp_softmax(double x) { return std::exp(x); }

// C (M, N) += A (M, K) · B (K, N), A[i·ai + k·ak], B[k·ldb + j], C[i·ldc + j]. Each C entry is its
// own sum over k in order, whatever the tiling, so a tile's entries do not depend on where it sits.
template <typename Real, int MR, int NR>
LFC_TILE void tile_gemm_block(int64_t K, const Real* A, int64_t ai, int64_t ak, const Real* B, int64_t ldb, Real* C,
                            int64_t ldc) {
  Real acc[MR][NR];
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++) acc[r][j] = C[r * ldc + j];
  for (int64_t k = 0; k < K; k++) {
    const Real* b = B + k * ldb;
    for (int r = 0; r < MR; r++) {
      const Real a = A[r * ai + k * ak];
      for (int j = 0; j < NR; j++) acc[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++) C[r * ldc + j] = acc[r][j];
}

// MR rows of C: its columns in register tiles of NR, then NR/2 and NR/4 (≥ 4), then one at a time
template <typename Real, int MR, int NR>
LFC_TILE void tile_gemm_rows(int64_t N, int64_t K, const Real* A, int64_t ai, int64_t ak, const Real* B, int64_t ldb,
                             Real* C, int64_t ldc) {
  constexpr int NR2 = NR / 2 >= 4 ? NR / 2 : 4, NR4 = NR / 4 >= 4 ? NR / 4 : 4;
  int64_t j = 0;
  for (; j + NR <= N; j += NR) tile_gemm_block<Real, MR, NR>(K, A, ai, ak, B + j, ldb, C + j, ldc);
  for (; j + NR2 <= N; j += NR2) tile_gemm_block<Real, MR, NR2>(K, A, ai, ak, B + j, ldb, C + j, ldc);
  for (; j + NR4 <= N; j += NR4) tile_gemm_block<Real, MR, NR4>(K, A, ai, ak, B + j, ldb, C + j, ldc);
  for (; j < N; j++)
    for (int64_t r = 0; r < MR; r++) {
      Real s = C[r * ldc + j];
      for (int64_t k = 0; k < K; k++) s += A[r * ai + k * ak] * B[k * ldb + j];
      C[r * ldc + j] = s;
    }
}

// rows in tiles of 8 (NR ≥ 32: AVX-512's 32 registers hold 16 accumulators) or 4, then one at a time
template <typename Real, int NR>
LFC_TILE void tile_gemm(int64_t M, int64_t N, int64_t K, const Real* A, int64_t ai, int64_t ak, const Real* B,
                        int64_t ldb, Real* C, int64_t ldc) {
  constexpr int MR = NR >= 32 ? 8 : 4;
  int64_t i = 0;
  for (; i + MR <= M; i += MR) tile_gemm_rows<Real, MR, NR>(N, K, A + i * ai, ai, ak, B, ldb, C + i * ldc, ldc);
  if (MR > 4)
    for (; i + 4 <= M; i += 4) tile_gemm_rows<Real, 4, NR>(N, K, A + i * ai, ai, ak, B, ldb, C + i * ldc, ldc);
  for (; i < M; i++) tile_gemm_rows<Real, 1, NR>(N, K, A + i * ai, ai, ak, B, ldb, C + i * ldc, ldc);
}

// yt (dc, kBlock) = Y[0 : rows, c0 : c0 + dc]ᵀ, Y (rows, ·) of row stride ldy
template <typename Real>
LFC_TILE void transpose_rows(Real* yt, const Real* Y, int64_t ldy, int64_t rows, int64_t c0, int64_t dc) {
  for (int64_t j = 0; j < rows; j++)
    for (int64_t c = 0; c < dc; c++) yt[c * kBlock + j] = Y[j * ldy + c0 + c];
}

// Head dims whose whole Yᵀ a block transposes once (kMaxD × kBlock Real, 32 KiB); past it, Yᵀ is
// transposed again per tile in chunks of kDChunk.
template <typename Real>
constexpr int64_t kMaxD = 32768 / (kBlock * int64_t(sizeof(Real)));

// A block's operand that the scores take transposed, Y (rows, d; row stride ldy): all of Yᵀ once
// (d ≤ kMaxD), or a chunk buffer filled per tile
template <typename Real>
struct Transposed {
  const Real* Y;
  int64_t ldy, rows, d;
  Real* yt;  // (kMaxD, kBlock)
  bool whole;
};

template <typename Real>
LFC_TILE Transposed<Real> transposed(const Real* Y, int64_t ldy, int64_t rows, int64_t d, Real* yt) {
  const bool whole = d <= kMaxD<Real>;
  if (whole) transpose_rows(yt, Y, ldy, rows, 0, d);
  return {Y, ldy, rows, d, yt, whole};
}

// S (xr, yr; row stride kBlock) = X (xr, d; row stride ldx) · Yᵀ. Each entry sums c = 0 … d−1 in
// order, whether Yᵀ is whole or in chunks, and whichever of the two operands is X: so a score has the
// same bits in S (queries as rows) and in Sᵀ (keys as rows), in the forward and in the backward.
template <typename Real, int NR>
LFC_TILE void tile_scores(Real* S, const Real* X, int64_t ldx, int64_t xr, const Transposed<Real>& Y) {
  for (int64_t i = 0; i < xr; i++) std::fill(S + i * kBlock, S + i * kBlock + Y.rows, Real(0));
  if (Y.whole) {
    tile_gemm<Real, NR>(xr, Y.rows, Y.d, X, ldx, 1, Y.yt, kBlock, S, kBlock);
    return;
  }
  for (int64_t c0 = 0; c0 < Y.d; c0 += kDChunk) {
    const int64_t dc = std::min(kDChunk, Y.d - c0);
    transpose_rows(Y.yt, Y.Y, Y.ldy, Y.rows, c0, dc);
    tile_gemm<Real, NR>(xr, Y.rows, dc, X + c0, ldx, 1, Y.yt, kBlock, S, kBlock);
  }
}

// The segment ids of one block of tokens: the range of its non-padding ids, and whether it holds
// padding.
struct BlockIds {
  int32_t lo, hi;  // lo > hi: padding only
  bool padding;
};

enum class TileMask { none, all, some };  // visible entries of a tile: none (skip), all, some

struct Tiling {
  const int32_t* segments;
  int64_t T, blocks;
  bool causal;
  const BlockIds* ids;  // (blocks)

  int64_t start(int64_t b) const { return b * kBlock; }
  int64_t size(int64_t b) const { return std::min(kBlock, T - b * kBlock); }

  TileMask mask(int64_t I, int64_t J) const {
    const int64_t i0 = start(I), i1 = i0 + size(I), j0 = start(J), j1 = j0 + size(J);
    if (causal && j0 > i1 - 1) return TileMask::none;
    const BlockIds &r = ids[I], &c = ids[J];
    // a padding token sees only itself, in the diagonal tile
    if (I != J && (r.lo > r.hi || c.lo > c.hi || r.hi < c.lo || c.hi < r.lo)) return TileMask::none;
    const bool one_id = r.lo == r.hi && c.lo == c.hi && r.lo == c.lo && !r.padding && !c.padding;
    return one_id && (!causal || j1 - 1 <= i0) ? TileMask::all : TileMask::some;
  }
};

Tiling tiling(const int32_t* segments, int64_t T, bool causal, ScratchScope& scratch) {
  const int64_t blocks = (T + kBlock - 1) / kBlock;
  BlockIds* ids = scratch.take<BlockIds>(blocks);  // (blocks)
  for (int64_t b = 0; b < blocks; b++) {
    BlockIds& bi = ids[b];
    bi = {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), false};
    for (int64_t t = b * kBlock; t < std::min(T, (b + 1) * kBlock); t++) {
      if (segments[t] < 0) {
        bi.padding = true;
        continue;
      }
      bi.lo = std::min(bi.lo, segments[t]);
      bi.hi = std::max(bi.hi, segments[t]);
    }
  }
  return {segments, T, blocks, causal, ids};
}

// D (rb) = rowsum(dO ∘ O) of the rows of block I, head h (row stride ldq), in double
template <typename Real>
LFC_TILE void row_dots(Real* D, const Real* dO, const Real* O, int64_t ldq, int64_t rb, int64_t d) {
  for (int64_t i = 0; i < rb; i++) D[i] = Real(dot(dO + i * ldq, O + i * ldq, d));
}

// The probabilities of tile (I, J) transposed, Pᵀ (cb, rb; row stride kBlock) = exp(scale · Sᵀ − lse),
// 0 where masked, from Sᵀ in place
template <typename Real>
LFC_TILE void probs_t(Real* Pt, const Tiling& tl, int64_t I, int64_t J, TileMask mask, const Real* lse, Real scale) {
  const int64_t i0 = tl.start(I), rb = tl.size(I), j0 = tl.start(J), cb = tl.size(J);
  for (int64_t j = 0; j < cb; j++) {
    Real* row = Pt + j * kBlock;
    for (int64_t i = 0; i < rb; i++) row[i] = exp_softmax(row[i] * scale - lse[i]);
    if (mask == TileMask::some)
      for (int64_t i = 0; i < rb; i++)
        if (!attends(tl.segments, i0 + i, j0 + j, tl.causal)) row[i] = 0;
  }
}

// forward of query block I, head h. Its tiles are transposed, Sᵀ (keys as rows), so that the
// softmax's per-query statistics run along the rows of the tile and vectorize.
template <typename Real, int NR>
LFC_TILE void forward_block(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const Tiling& tl,
                            int64_t I, int64_t h, int64_t nh, int64_t nkv, int64_t d, Real scale) {
  constexpr Real kNegInf = -std::numeric_limits<Real>::infinity();
  alignas(64) Real St[kBlock * kBlock];     // (cb, rb), row stride kBlock: scores, then probabilities
  alignas(64) Real qt[kMaxD<Real> * kBlock];  // Qᵀ of the block
  alignas(64) Real m[kBlock], l[kBlock], mx[kBlock], alpha[kBlock];  // per query row
  const int64_t kvh = h / (nh / nkv), ldq = nh * d, ldkv = nkv * d;
  const int64_t i0 = tl.start(I), rb = tl.size(I);
  const Real* Q = q + (i0 * nh + h) * d;  // (rb, d), row stride ldq
  Real* O = out + (i0 * nh + h) * d;      // (rb, d), row stride ldq
  const Transposed<Real> Qt = transposed(Q, ldq, rb, d, qt);
  for (int64_t i = 0; i < rb; i++) {
    std::fill(O + i * ldq, O + i * ldq + d, Real(0));
    m[i] = kNegInf;
    l[i] = 0;
  }
  const int64_t last = tl.causal ? I : tl.blocks - 1;
  for (int64_t J = 0; J <= last; J++) {
    const TileMask mask = tl.mask(I, J);
    if (mask == TileMask::none) continue;
    const int64_t j0 = tl.start(J), cb = tl.size(J);
    const Real* K = k + (j0 * nkv + kvh) * d;  // (cb, d), row stride ldkv
    const Real* V = v + (j0 * nkv + kvh) * d;  // (cb, d), row stride ldkv
    tile_scores<Real, NR>(St, K, ldkv, cb, Qt);
    std::fill(mx, mx + rb, kNegInf);
    for (int64_t j = 0; j < cb; j++) {
      Real* row = St + j * kBlock;
      for (int64_t i = 0; i < rb; i++) row[i] *= scale;
      if (mask == TileMask::some)
        for (int64_t i = 0; i < rb; i++)
          if (!attends(tl.segments, i0 + i, j0 + j, tl.causal)) row[i] = kNegInf;
      for (int64_t i = 0; i < rb; i++) mx[i] = std::max(mx[i], row[i]);
    }
    // online softmax: the new max of each row, the factor on what the row holds so far
    for (int64_t i = 0; i < rb; i++) {
      const Real m_new = std::max(m[i], mx[i]);
      alpha[i] = m_new == m[i] ? Real(1) : exp_softmax(m[i] - m_new);
      m[i] = m_new;
      mx[i] = m_new == kNegInf ? Real(0) : m_new;  // the shift; a row with nothing visible yet stays 0
      l[i] *= alpha[i];
    }
    for (int64_t j = 0; j < cb; j++) {
      Real* row = St + j * kBlock;
      for (int64_t i = 0; i < rb; i++) {
        row[i] = exp_softmax(row[i] - mx[i]);
        l[i] += row[i];
      }
    }
    for (int64_t i = 0; i < rb; i++)
      if (alpha[i] != Real(1)) {
        Real* o = O + i * ldq;
        for (int64_t c = 0; c < d; c++) o[c] *= alpha[i];
      }
    tile_gemm<Real, NR>(rb, d, cb, St, 1, kBlock, V, ldkv, O, ldq);  // O_I += P V_J = (Pᵀ)ᵀ V_J
  }
  for (int64_t i = 0; i < rb; i++) {  // every row sees at least its own token: l ≥ 1
    const Real inv = Real(1) / l[i];
    Real* o = O + i * ldq;
    for (int64_t c = 0; c < d; c++) o[c] *= inv;
    lse[(i0 + i) * nh + h] = m[i] + std::log(l[i]);
  }
}

// backward pass 1: dK, dV of key block J, KV head kvh, over the group's query heads. Tiles with
// queries as rows: P, dS (rb, cb).
template <typename Real, int NR>
LFC_TILE void backward_kv_block(Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k, const Real* v,
                                const Real* out, const Real* lse, const Tiling& tl, int64_t J, int64_t kvh,
                                int64_t nh, int64_t nkv, int64_t d, Real scale) {
  alignas(64) Real P[kBlock * kBlock], dS[kBlock * kBlock];  // (rb, cb), row stride kBlock
  alignas(64) Real kt[kMaxD<Real> * kBlock], vt[kMaxD<Real> * kBlock];
  Real D[kBlock];
  const int64_t g = nh / nkv, ldq = nh * d, ldkv = nkv * d;
  const int64_t j0 = tl.start(J), cb = tl.size(J);
  const Real* K = k + (j0 * nkv + kvh) * d;  // (cb, d), row stride ldkv
  const Real* V = v + (j0 * nkv + kvh) * d;
  Real* dK = dk + (j0 * nkv + kvh) * d;
  Real* dV = dv + (j0 * nkv + kvh) * d;
  const Transposed<Real> Kt = transposed(K, ldkv, cb, d, kt), Vt = transposed(V, ldkv, cb, d, vt);
  for (int64_t j = 0; j < cb; j++) {
    std::fill(dK + j * ldkv, dK + j * ldkv + d, Real(0));
    std::fill(dV + j * ldkv, dV + j * ldkv + d, Real(0));
  }
  for (int64_t h = kvh * g; h < (kvh + 1) * g; h++)
    for (int64_t I = tl.causal ? J : 0; I < tl.blocks; I++) {
      const TileMask mask = tl.mask(I, J);
      if (mask == TileMask::none) continue;
      const int64_t i0 = tl.start(I), rb = tl.size(I);
      const int64_t row0 = (i0 * nh + h) * d;  // Q, O, dO of block I, head h: (rb, d), row stride ldq
      const Real* L = lse + i0 * nh + h;       // (rb), stride nh
      // P = exp(scale · Q Kᵀ − lse), 0 where masked
      tile_scores<Real, NR>(P, q + row0, ldq, rb, Kt);
      for (int64_t i = 0; i < rb; i++) {
        Real* row = P + i * kBlock;
        const Real li = L[i * nh];
        for (int64_t j = 0; j < cb; j++) row[j] = exp_softmax(row[j] * scale - li);
        if (mask == TileMask::some)
          for (int64_t j = 0; j < cb; j++)
            if (!attends(tl.segments, i0 + i, j0 + j, tl.causal)) row[j] = 0;
      }
      row_dots(D, dout + row0, out + row0, ldq, rb, d);
      tile_gemm<Real, NR>(cb, d, rb, P, 1, kBlock, dout + row0, ldq, dV, ldkv);  // dV_J += Pᵀ dO_I
      // dS = scale · P ∘ (dO Vᵀ − D); 0 on a padding row (out = v there: no score gradient)
      tile_scores<Real, NR>(dS, dout + row0, ldq, rb, Vt);
      for (int64_t i = 0; i < rb; i++) {
        Real* ds = dS + i * kBlock;
        const Real* p = P + i * kBlock;
        if (tl.segments[i0 + i] < 0) {
          std::fill(ds, ds + cb, Real(0));
          continue;
        }
        for (int64_t j = 0; j < cb; j++) ds[j] = scale * p[j] * (ds[j] - D[i]);
      }
      tile_gemm<Real, NR>(cb, d, rb, dS, 1, kBlock, q + row0, ldq, dK, ldkv);  // dK_J += dSᵀ Q_I
    }
}

// backward pass 2: dQ of query block I, head h. Tiles with keys as rows: Pᵀ, dSᵀ (cb, rb).
template <typename Real, int NR>
LFC_TILE void backward_q_block(Real* dq, const Real* dout, const Real* q, const Real* k, const Real* v,
                               const Real* out, const Real* lse, const Tiling& tl, int64_t I, int64_t h, int64_t nh,
                               int64_t nkv, int64_t d, Real scale) {
  alignas(64) Real Pt[kBlock * kBlock], dSt[kBlock * kBlock];  // (cb, rb), row stride kBlock
  alignas(64) Real qt[kMaxD<Real> * kBlock], dot_[kMaxD<Real> * kBlock];
  alignas(64) Real D[kBlock], L[kBlock], keep[kBlock];  // keep: scale, 0 on a padding row (no score gradient)
  const int64_t kvh = h / (nh / nkv), ldq = nh * d, ldkv = nkv * d;
  const int64_t i0 = tl.start(I), rb = tl.size(I);
  const int64_t row0 = (i0 * nh + h) * d;
  Real* dQ = dq + row0;  // (rb, d), row stride ldq
  const Transposed<Real> Qt = transposed(q + row0, ldq, rb, d, qt), dOt = transposed(dout + row0, ldq, rb, d, dot_);
  for (int64_t i = 0; i < rb; i++) {
    std::fill(dQ + i * ldq, dQ + i * ldq + d, Real(0));
    L[i] = lse[(i0 + i) * nh + h];
    keep[i] = tl.segments[i0 + i] < 0 ? Real(0) : scale;
  }
  row_dots(D, dout + row0, out + row0, ldq, rb, d);
  const int64_t last = tl.causal ? I : tl.blocks - 1;
  for (int64_t J = 0; J <= last; J++) {
    const TileMask mask = tl.mask(I, J);
    if (mask == TileMask::none) continue;
    const int64_t j0 = tl.start(J), cb = tl.size(J);
    const Real* K = k + (j0 * nkv + kvh) * d;
    const Real* V = v + (j0 * nkv + kvh) * d;
    tile_scores<Real, NR>(Pt, K, ldkv, cb, Qt);
    probs_t(Pt, tl, I, J, mask, L, scale);
    tile_scores<Real, NR>(dSt, V, ldkv, cb, dOt);  // dPᵀ = V dOᵀ
    for (int64_t j = 0; j < cb; j++) {
      Real* ds = dSt + j * kBlock;
      const Real* p = Pt + j * kBlock;
      for (int64_t i = 0; i < rb; i++) ds[i] = keep[i] * p[i] * (ds[i] - D[i]);
    }
    tile_gemm<Real, NR>(rb, d, cb, dSt, 1, kBlock, K, ldkv, dQ, ldq);  // dQ_I += dS K_J = (dSᵀ)ᵀ K_J
  }
}

// The pooled tasks: forward (head h, query block I), backward pass 1 (KV head, key block J),
// pass 2 (head h, query block I). Task t of a pass is one pool block.
enum class Pass { forward, backward_kv, backward_q };

template <typename Real>
struct Operands {
  const Real *q, *k, *v;
  Real *out, *lse;                    // forward: written
  const Real *dout, *out_in, *lse_in;  // backward: read
  Real *dq, *dk, *dv;                  // backward: written
  Tiling tl;
  int64_t nh, nkv, d;
  Real scale;
};

template <typename Real, int NR>
LFC_TILE void run_tasks(Pass pass, const Operands<Real>& a, int64_t begin, int64_t end) {
  const int64_t blocks = a.tl.blocks;
  for (int64_t t = begin; t < end; t++) {
    // heavy tasks first, so the pool's last ones are short: causal query blocks from the last,
    // causal key blocks from the first
    if (pass == Pass::forward)
      forward_block<Real, NR>(a.out, a.lse, a.q, a.k, a.v, a.tl, blocks - 1 - t / a.nh, t % a.nh, a.nh, a.nkv, a.d,
                              a.scale);
    else if (pass == Pass::backward_kv)
      backward_kv_block<Real, NR>(a.dk, a.dv, a.dout, a.q, a.k, a.v, a.out_in, a.lse_in, a.tl, t / a.nkv, t % a.nkv, a.nh,
                                  a.nkv, a.d, a.scale);
    else
      backward_q_block<Real, NR>(a.dq, a.dout, a.q, a.k, a.v, a.out_in, a.lse_in, a.tl, blocks - 1 - t / a.nh, t % a.nh,
                                 a.nh, a.nkv, a.d, a.scale);
  }
}

// One copy of the tile loops per x86-64 ISA level, picked from CPUID once (the build targets
// x86-64-v2; lfc's machines have AVX-512): v4 (AVX-512) with 32-column register tiles, v3 (AVX2,
// FMA) 16, v2 (the build's own) 8. Results differ between levels (FMA contracts mul + add); on one
// machine they are the same bits at any thread count.
template <typename Real>
using RunTasks = void (*)(Pass, const Operands<Real>&, int64_t, int64_t);

template <typename Real>
void run_tasks_v2(Pass pass, const Operands<Real>& a, int64_t b, int64_t e) {
  run_tasks<Real, 8>(pass, a, b, e);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <typename Real>
__attribute__((target("arch=x86-64-v3"))) void run_tasks_v3(Pass pass, const Operands<Real>& a, int64_t b,
                                                             int64_t e) {
  run_tasks<Real, 16>(pass, a, b, e);
}
template <typename Real>
__attribute__((target("arch=x86-64-v4"))) void run_tasks_v4(Pass pass, const Operands<Real>& a, int64_t b,
                                                             int64_t e) {
  run_tasks<Real, 32>(pass, a, b, e);
}
#endif

template <typename Real>
RunTasks<Real> run_tasks_for_cpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("x86-64-v4")) return run_tasks_v4<Real>;
  if (__builtin_cpu_supports("x86-64-v3")) return run_tasks_v3<Real>;
#endif
  return run_tasks_v2<Real>;
}

template <typename Real>
void run_pass(Pass pass, const Operands<Real>& a, int64_t tasks) {
  static const RunTasks<Real> run = run_tasks_for_cpu<Real>();
  parallelFor(tasks, 1, [&](int64_t b, int64_t e) { run(pass, a, b, e); });
}

}  // namespace

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal) {
  check_heads("attention_forward", nh, nkv);
  ScratchScope scratch;
  Run* runs = scratch.take<Run>(T);  // (T)
  const int64_t nruns = segment_runs(segments, T, runs, scratch.take<int32_t>(T));
  if (nruns < 0) {  // windows: through the run kernel in segment order, and back
    int64_t* perm = scratch.take<int64_t>(T);
    int32_t* sorted = scratch.take<int32_t>(T);
    sort_by_segment(segments, T, perm, sorted);
    Real *qs = scratch.take<Real>(T * nh * d), *os = scratch.take<Real>(T * nh * d);
    Real *ks = scratch.take<Real>(T * nkv * d), *vs = scratch.take<Real>(T * nkv * d);
    Real* ls = scratch.take<Real>(T * nh);
    permute_rows(qs, q, perm, T, nh * d, false);
    permute_rows(ks, k, perm, T, nkv * d, false);
    permute_rows(vs, v, perm, T, nkv * d, false);
    attention_forward(os, ls, qs, ks, vs, sorted, T, nh, nkv, d, scale, causal);
    permute_rows(out, os, perm, T, nh * d, true);
    permute_rows(lse, ls, perm, T, nh, true);
    return;
  }
  const Tiling tl = tiling(segments, T, causal, scratch);
  const Operands<Real> a{q, k, v, out, lse, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, tl, nh, nkv, d,
                         Real(scale)};
  run_pass(Pass::forward, a, nh * tl.blocks);
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal) {
  check_heads("attention_backward", nh, nkv);
  ScratchScope scratch;
  Run* runs = scratch.take<Run>(T);  // (T)
  const int64_t nruns = segment_runs(segments, T, runs, scratch.take<int32_t>(T));
  if (nruns < 0) {  // windows: through the run kernel in segment order, and back
    int64_t* perm = scratch.take<int64_t>(T);
    int32_t* sorted = scratch.take<int32_t>(T);
    sort_by_segment(segments, T, perm, sorted);
    const int64_t nq = T * nh * d, nk = T * nkv * d;
    Real *dos = scratch.take<Real>(nq), *qs = scratch.take<Real>(nq), *os = scratch.take<Real>(nq);
    Real *ks = scratch.take<Real>(nk), *vs = scratch.take<Real>(nk), *ls = scratch.take<Real>(T * nh);
    Real *dqs = scratch.take<Real>(nq), *dks = scratch.take<Real>(nk), *dvs = scratch.take<Real>(nk);
    permute_rows(dos, dout, perm, T, nh * d, false);
    permute_rows(qs, q, perm, T, nh * d, false);
    permute_rows(os, out, perm, T, nh * d, false);
    permute_rows(ks, k, perm, T, nkv * d, false);
    permute_rows(vs, v, perm, T, nkv * d, false);
    permute_rows(ls, lse, perm, T, nh, false);
    attention_backward(dqs, dks, dvs, dos, qs, ks, vs, os, ls, sorted, T, nh, nkv, d, scale, causal);
    permute_rows(dq, dqs, perm, T, nh * d, true);
    permute_rows(dk, dks, perm, T, nkv * d, true);
    permute_rows(dv, dvs, perm, T, nkv * d, true);
    return;
  }
  const Tiling tl = tiling(segments, T, causal, scratch);
  const Operands<Real> a{q, k, v, nullptr, nullptr, dout, out, lse, dq, dk, dv, tl, nh, nkv, d, Real(scale)};
  run_pass(Pass::backward_kv, a, nkv * tl.blocks);
  run_pass(Pass::backward_q, a, nh * tl.blocks);
}

#define LFC_INSTANTIATE_ATTENTION(NS, Real)                                                         \
  template void NS attention_forward<Real>(Real*, Real*, const Real*, const Real*, const Real*,     \
                                           const int32_t*, int64_t, int64_t, int64_t, int64_t,      \
                                           double, bool);                                           \
  template void NS attention_backward<Real>(Real*, Real*, Real*, const Real*, const Real*,          \
                                            const Real*, const Real*, const Real*, const Real*,     \
                                            const int32_t*, int64_t, int64_t, int64_t, int64_t,     \
                                            double, bool);
LFC_INSTANTIATE_ATTENTION(, float)
LFC_INSTANTIATE_ATTENTION(, double)
LFC_INSTANTIATE_ATTENTION(ref::, float)
LFC_INSTANTIATE_ATTENTION(ref::, double)

// ---- by storage dtype ---------------------------------------------------------------------------

void attention_forward(Dst out, Dst lse, Src q, Src k, Src v, const int32_t* segments, int64_t T, int64_t nh,
                       int64_t nkv, int64_t d, double scale, bool causal) {
  const int64_t nq = T * nh * d, nk = T * nkv * d;
  by_dtype("attention_forward", {out, lse, q, k, v}, [&](auto& s) {
    attention_forward(s.out(out, nq), s.out(lse, T * nh), s.in(q, nq), s.in(k, nk), s.in(v, nk), segments, T, nh,
                      nkv, d, scale, causal);
  });
}

void attention_backward(Dst dq, Dst dk, Dst dv, Src dout, Src q, Src k, Src v, Src out, Src lse,
                        const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale,
                        bool causal) {
  const int64_t nq = T * nh * d, nk = T * nkv * d;
  by_dtype("attention_backward", {dq, dk, dv, dout, q, k, v, out, lse}, [&](auto& s) {
    attention_backward(s.out(dq, nq), s.out(dk, nk), s.out(dv, nk), s.in(dout, nq), s.in(q, nq), s.in(k, nk),
                       s.in(v, nk), s.in(out, nq), s.in(lse, T * nh), segments, T, nh, nkv, d, scale, causal);
  });
}

}  // namespace lfc::cpu
