// The bf16/ tier of kernel_check: every kernel's entry point (kernels/cpu/storage.h) on bf16
// storage against the f32 compute core, the reference, on the SAME bf16-rounded inputs; each
// operand in the dtype a mixed-precision (--bf16) plan gives it (activations and weights bf16,
// weight gradients, statistics and router f32), plus a few other mixes. Error per output:
// NMSE = Σ(out − ref)² / Σref² (Σ(out − ref)² when ref is all zero), tolerance kBf16Tol.
// Then the exact checks of the conversion itself (core/bf16.h): ties to even, NaN, inf, denormals.
#include "check.h"
#include "core/bf16.h"
#include "kernels/cpu/storage.h"

namespace {

using lfc::bf16;
using lfc::DType;
using Bits = std::vector<bf16>;

constexpr double kBf16Tol = 1e-4;

Bits bits_of(const VecF& v) {
  Bits b(v.size());
  lfc::bf16FromFloat(b.data(), v.data(), int64_t(v.size()));
  return b;
}

VecF floats_of(const Bits& b) {
  VecF v(b.size());
  lfc::floatFromBf16(v.data(), b.data(), int64_t(b.size()));
  return v;
}

// n random values rounded to bf16: as bf16 storage and as the same numbers in float
struct Rounded {
  Bits bits;
  VecF f;
};
Rounded rounded(Rng& rng, size_t n, double lo = -1, double hi = 1) {
  const Bits b = bits_of(to_float(rng.vec(n, lo, hi)));
  return {b, floats_of(b)};
}

bool same_bits(const Bits& a, const Bits& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i].bits != b[i].bits) return false;
  return true;
}

cpu::Src in(const Bits& b) { return {b.data(), DType::bf16}; }
cpu::Src in(const VecF& v) { return {v.data(), DType::f32}; }
cpu::Dst out(Bits& b) { return {b.data(), DType::bf16}; }
cpu::Dst out(VecF& v) { return {v.data(), DType::f32}; }

double nmse(const VecF& got, const VecF& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = double(got[i]) - double(ref[i]);
    diff += d * d;
    scale += double(ref[i]) * double(ref[i]);
  }
  return scale > 0 ? diff / scale : diff;
}
double nmse(const Bits& got, const VecF& ref) { return nmse(floats_of(got), ref); }
double nmse(double got, double ref) { return nmse(VecF{float(got)}, VecF{float(ref)}); }

void check(const std::string& what, double err) { report("bf16/" + what, err, kBf16Tol); }

// ---- linear ------------------------------------------------------------------------------------

void bf16_linear() {
  const int64_t N = 37, in_ = 50, out_ = 29;
  Rng rng(41);
  Rounded x = rounded(rng, N * in_), w = rounded(rng, out_ * in_), b = rounded(rng, out_), dy = rounded(rng, N * out_);
  VecF y_ref(N * out_);
  cpu::linear_forward(y_ref.data(), x.f.data(), w.f.data(), b.f.data(), N, in_, out_);
  Bits y(N * out_);
  cpu::linear_forward(out(y), in(x.bits), in(w.bits), in(b.bits), N, in_, out_);
  check("linear_forward y", nmse(y, y_ref));
  // the MoE router's linear: bf16 x and w, f32 logits (bf16 products are exact in f32)
  VecF logits(N * out_), logits_ref(N * out_);
  cpu::linear_forward<float>(logits_ref.data(), x.f.data(), w.f.data(), nullptr, N, in_, out_);
  cpu::linear_forward(out(logits), in(x.bits), in(w.bits), cpu::Src{}, N, in_, out_);
  check("linear_forward y f32 (router)", nmse(logits, logits_ref));

  VecF dx_ref(N * in_);
  cpu::linear_backward_data(dx_ref.data(), dy.f.data(), w.f.data(), N, in_, out_);
  Bits dx(N * in_);
  cpu::linear_backward_data(out(dx), in(dy.bits), in(w.bits), N, in_, out_);
  check("linear_backward_data dx", nmse(dx, dx_ref));

  // fp32 main gradients, accumulated onto nonzero buffers
  VecF dw = to_float(rng.vec(out_ * in_)), db = to_float(rng.vec(out_)), dw_ref = dw, db_ref = db;
  cpu::linear_backward_weight(dw_ref.data(), db_ref.data(), dy.f.data(), x.f.data(), N, in_, out_);
  cpu::linear_backward_weight(out(dw), out(db), in(dy.bits), in(x.bits), N, in_, out_);
  check("linear_backward_weight dw f32 (accumulating)", nmse(dw, dw_ref));
  check("linear_backward_weight db f32 (accumulating)", nmse(db, db_ref));
}

void bf16_grouped_linear() {
  const Ints counts = {40, 0, 13, 60};  // an expert with no rows, 31 rows past Σ counts
  const int64_t E = 4, N = 144, in_ = 32, out_ = 48;
  Rng rng(43);
  Rounded x = rounded(rng, N * in_), dy = rounded(rng, N * out_);
  std::vector<Rounded> w;
  for (int64_t e = 0; e < E; e++) w.push_back(rounded(rng, out_ * in_));
  std::vector<const float*> wf;
  std::vector<cpu::Src> wb;
  for (const Rounded& we : w) {
    wf.push_back(we.f.data());
    wb.push_back(in(we.bits));
  }
  VecF y_ref(N * out_);
  cpu::grouped_linear_forward(y_ref.data(), x.f.data(), counts.data(), wf.data(), E, N, in_, out_);
  Bits y = bits_of(VecF(N * out_, 7.f));  // garbage: rows past Σ counts must be zeroed
  cpu::grouped_linear_forward(out(y), in(x.bits), counts.data(), wb, N, in_, out_);
  check("grouped_linear_forward y", nmse(y, y_ref));

  VecF dx_ref(N * in_);
  cpu::grouped_linear_backward_data(dx_ref.data(), dy.f.data(), counts.data(), wf.data(), E, N, in_, out_);
  Bits dx = bits_of(VecF(N * in_, 7.f));
  cpu::grouped_linear_backward_data(out(dx), in(dy.bits), counts.data(), wb, N, in_, out_);
  check("grouped_linear_backward_data dx", nmse(dx, dx_ref));

  VecF dw = to_float(rng.vec(E * out_ * in_)), dw_ref = dw;
  std::vector<float*> dwf;
  std::vector<cpu::Dst> dwb;
  for (int64_t e = 0; e < E; e++) {
    dwf.push_back(dw_ref.data() + e * out_ * in_);
    dwb.push_back({dw.data() + e * out_ * in_, DType::f32});
  }
  cpu::grouped_linear_backward_weight(dwf.data(), dy.f.data(), x.f.data(), counts.data(), E, N, in_, out_);
  cpu::grouped_linear_backward_weight(dwb, in(dy.bits), in(x.bits), counts.data(), N, in_, out_);
  check("grouped_linear_backward_weight dw f32 (accumulating)", nmse(dw, dw_ref));
}

// ---- norms ---------------------------------------------------------------------------------------

void bf16_norms() {
  const int64_t R = 12, H = 40;
  const double eps = 1e-5;
  Rng rng(47);
  Rounded x = rounded(rng, R * H, -3, 3), w = rounded(rng, H), b = rounded(rng, H), dy = rounded(rng, R * H);
  // layernorm: y bf16, statistics f32
  VecF y_ref(R * H), mean_ref(R), rstd_ref(R), mean(R), rstd(R);
  cpu::layernorm_forward(y_ref.data(), mean_ref.data(), rstd_ref.data(), x.f.data(), w.f.data(), b.f.data(), R, H,
                         eps);
  Bits y(R * H);
  cpu::layernorm_forward(out(y), out(mean), out(rstd), in(x.bits), in(w.bits), in(b.bits), R, H, eps);
  check("layernorm_forward y", nmse(y, y_ref));
  check("layernorm_forward mean, rstd f32", std::max(nmse(mean, mean_ref), nmse(rstd, rstd_ref)));
  // backward: dx bf16, dw and db f32 accumulated
  VecF dx_ref(R * H), dw = to_float(rng.vec(H)), db = to_float(rng.vec(H)), dw_ref = dw, db_ref = db;
  cpu::layernorm_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.f.data(), x.f.data(), w.f.data(),
                          mean_ref.data(), rstd_ref.data(), R, H);
  Bits dx(R * H);
  cpu::layernorm_backward(out(dx), out(dw), out(db), in(dy.bits), in(x.bits), in(w.bits), in(mean_ref), in(rstd_ref),
                          R, H);
  check("layernorm_backward dx", nmse(dx, dx_ref));
  check("layernorm_backward dw, db f32 (accumulating)", std::max(nmse(dw, dw_ref), nmse(db, db_ref)));

  VecF ry_ref(R * H), rrstd_ref(R), rrstd(R);
  cpu::rmsnorm_forward(ry_ref.data(), rrstd_ref.data(), x.f.data(), w.f.data(), R, H, eps);
  Bits ry(R * H);
  cpu::rmsnorm_forward(out(ry), out(rrstd), in(x.bits), in(w.bits), R, H, eps);
  check("rmsnorm_forward y", nmse(ry, ry_ref));
  check("rmsnorm_forward rstd f32", nmse(rrstd, rrstd_ref));
  VecF rdx_ref(R * H), rdw = to_float(rng.vec(H)), rdw_ref = rdw;
  cpu::rmsnorm_backward(rdx_ref.data(), rdw_ref.data(), dy.f.data(), x.f.data(), w.f.data(), rrstd_ref.data(), R, H);
  Bits rdx(R * H);
  cpu::rmsnorm_backward(out(rdx), out(rdw), in(dy.bits), in(x.bits), in(w.bits), in(rrstd_ref), R, H);
  check("rmsnorm_backward dx", nmse(rdx, rdx_ref));
  check("rmsnorm_backward dw f32 (accumulating)", nmse(rdw, rdw_ref));
}

// ---- embedding -----------------------------------------------------------------------------------

void bf16_embedding() {
  const int64_t T = 9, V = 7, H = 6;
  Rng rng(53);
  const Ints ids = {3, 0, 6, 3, 1, 1, 5, 2, 3};  // repeats accumulate
  Rounded table = rounded(rng, V * H), dy = rounded(rng, T * H);
  VecF y_ref(T * H);
  cpu::embedding_forward(y_ref.data(), ids.data(), table.f.data(), T, V, H);
  Bits y(T * H);
  cpu::embedding_forward(out(y), ids.data(), in(table.bits), T, V, H);
  check("embedding_forward y", nmse(y, y_ref));
  VecF dt = to_float(rng.vec(V * H)), dt_ref = dt;
  cpu::embedding_backward(dt_ref.data(), dy.f.data(), ids.data(), T, V, H);
  cpu::embedding_backward(out(dt), in(dy.bits), ids.data(), T, V, H);
  check("embedding_backward dtable f32 (accumulating)", nmse(dt, dt_ref));

  // vocab-parallel: this rank holds rows [7, 14) of 21
  const Ints vids = {3, 8, 13, 20, 7, 7, 0, 12, 9};
  const int64_t first = 7, vocab = 21;
  VecF sy_ref(T * H);
  cpu::embedding_shard_forward(sy_ref.data(), vids.data(), table.f.data(), T, V, H, first, vocab);
  Bits sy = bits_of(VecF(T * H, 7.f));  // rows of other ranks must be zeroed
  cpu::embedding_shard_forward(out(sy), vids.data(), in(table.bits), T, V, H, first, vocab);
  check("embedding_shard_forward y", nmse(sy, sy_ref));
  VecF sdt = to_float(rng.vec(V * H)), sdt_ref = sdt;
  cpu::embedding_shard_backward(sdt_ref.data(), dy.f.data(), vids.data(), T, V, H, first, vocab);
  cpu::embedding_shard_backward(out(sdt), in(dy.bits), vids.data(), T, V, H, first, vocab);
  check("embedding_shard_backward dtable f32 (accumulating)", nmse(sdt, sdt_ref));
}

// ---- elementwise ---------------------------------------------------------------------------------

void bf16_activations() {
  const int64_t n = 300;
  Rng rng(59);
  Rounded a = rounded(rng, n, -4, 4), b = rounded(rng, n, -4, 4), dy = rounded(rng, n);
  VecF y_ref(n), y2_ref(n);
  Bits y(n), y2(n);
  cpu::gelu_forward(y_ref.data(), a.f.data(), n);
  cpu::gelu_forward(out(y), in(a.bits), n);
  check("gelu_forward y", nmse(y, y_ref));
  cpu::gelu_backward(y_ref.data(), dy.f.data(), a.f.data(), n);
  cpu::gelu_backward(out(y), in(dy.bits), in(a.bits), n);
  check("gelu_backward dx", nmse(y, y_ref));
  cpu::swiglu_forward(y_ref.data(), a.f.data(), b.f.data(), n);
  cpu::swiglu_forward(out(y), in(a.bits), in(b.bits), n);
  check("swiglu_forward y", nmse(y, y_ref));
  cpu::swiglu_backward(y_ref.data(), y2_ref.data(), dy.f.data(), a.f.data(), b.f.data(), n);
  cpu::swiglu_backward(out(y), out(y2), in(dy.bits), in(a.bits), in(b.bits), n);
  check("swiglu_backward dgate, dup", std::max(nmse(y, y_ref), nmse(y2, y2_ref)));
  cpu::add_forward(y_ref.data(), a.f.data(), b.f.data(), n);
  cpu::add_forward(out(y), in(a.bits), in(b.bits), n);
  check("add_forward y", nmse(y, y_ref));
  cpu::add_backward(y_ref.data(), y2_ref.data(), dy.f.data(), n);
  cpu::add_backward(out(y), out(y2), in(dy.bits), n);
  check("add_backward da, db", std::max(nmse(y, y_ref), nmse(y2, y2_ref)));
  // in place (y = x), as the plan runs gelu and add
  Bits inplace = a.bits;
  cpu::gelu_forward(y_ref.data(), a.f.data(), n);
  cpu::gelu_forward(out(inplace), in(inplace), n);
  check("gelu_forward y in place", nmse(inplace, y_ref));
}

void bf16_rope() {
  const int64_t T = 6, nh = 3, d = 8, P = 2;
  const Ints sections = {3, 1}, positions = {0, 0, 1, 5, 2, 9, 3, 3, 4, 1, 7, 2};
  Rng rng(61);
  Rounded x = rounded(rng, T * nh * d);
  VecF y_ref(T * nh * d);
  Bits y(T * nh * d);
  cpu::rope_forward(y_ref.data(), x.f.data(), positions.data(), sections.data(), P, T, nh, d, 10000.0);
  cpu::rope_forward(out(y), in(x.bits), positions.data(), sections.data(), P, T, nh, d, 10000.0);
  check("rope_forward y", nmse(y, y_ref));
  cpu::rope_backward(y_ref.data(), x.f.data(), positions.data(), sections.data(), P, T, nh, d, 10000.0);
  cpu::rope_backward(out(y), in(x.bits), positions.data(), sections.data(), P, T, nh, d, 10000.0);
  check("rope_backward dx", nmse(y, y_ref));
}

// ---- attention -----------------------------------------------------------------------------------

void bf16_attention() {
  const Ints seg = segments_of({{0, 40}, {1, 1}, {2, 70}, {-1, 9}});
  const int64_t T = int64_t(seg.size()), nh = 4, nkv = 2, d = 16;
  const double scale = 1.0 / std::sqrt(double(d));
  Rng rng(67);
  Rounded q = rounded(rng, T * nh * d, -2, 2), k = rounded(rng, T * nkv * d, -2, 2), v = rounded(rng, T * nkv * d);
  Rounded dout = rounded(rng, T * nh * d);
  VecF o_ref(T * nh * d), lse_ref(T * nh), lse(T * nh);
  cpu::attention_forward(o_ref.data(), lse_ref.data(), q.f.data(), k.f.data(), v.f.data(), seg.data(), T, nh, nkv,
                         d, scale, true);
  Bits o(T * nh * d);
  cpu::attention_forward(out(o), out(lse), in(q.bits), in(k.bits), in(v.bits), seg.data(), T, nh, nkv, d, scale,
                         true);
  check("attention_forward out", nmse(o, o_ref));
  check("attention_forward lse f32", nmse(lse, lse_ref));
  // backward from the bf16 forward's out (the plan's) and its f32 lse, on both sides
  const VecF o_f = floats_of(o);
  VecF dq_ref(q.f.size()), dk_ref(k.f.size()), dv_ref(v.f.size());
  cpu::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.f.data(), q.f.data(), k.f.data(),
                          v.f.data(), o_f.data(), lse.data(), seg.data(), T, nh, nkv, d, scale, true);
  Bits dq(q.f.size()), dk(k.f.size()), dv(v.f.size());
  cpu::attention_backward(out(dq), out(dk), out(dv), in(dout.bits), in(q.bits), in(k.bits), in(v.bits), in(o),
                          in(lse), seg.data(), T, nh, nkv, d, scale, true);
  check("attention_backward dq", nmse(dq, dq_ref));
  check("attention_backward dk", nmse(dk, dk_ref));
  check("attention_backward dv", nmse(dv, dv_ref));
}

// ---- mixture of experts --------------------------------------------------------------------------

void bf16_moe() {
  const int64_t T = 10, E = 6, k = 2, H = 5, N = T * k;
  Rng rng(71);
  // router: bf16 logits (a mix; the plan's router is all f32) → f32 probs and weights
  Rounded logits = rounded(rng, T * E, -3, 3);
  VecF probs_ref(T * E), w_ref(T * k), probs(T * E), w(T * k);
  Ints ex_ref(T * k), ex(T * k);
  cpu::router_topk_forward(probs_ref.data(), w_ref.data(), ex_ref.data(), logits.f.data(), T, E, k);
  cpu::router_topk_forward(out(probs), out(w), ex.data(), in(logits.bits), T, E, k);
  check("router_topk_forward probs, weights f32",
        std::max(nmse(probs, probs_ref), nmse(w, w_ref)) + (ex == ex_ref ? 0.0 : 1.0));
  VecF wts(T * k), wts_ref(T * k);
  const Bits probs_b = bits_of(probs_ref);
  const VecF probs_bf = floats_of(probs_b);
  cpu::router_topk_weights(wts_ref.data(), probs_bf.data(), ex_ref.data(), T, E, k);
  cpu::router_topk_weights(out(wts), in(probs_b), ex_ref.data(), T, E, k);
  check("router_topk_weights f32 from bf16 probs", nmse(wts, wts_ref));
  Rounded dprobs = rounded(rng, T * E), dweights = rounded(rng, T * k);
  VecF dl_ref(T * E);
  cpu::router_topk_backward(dl_ref.data(), dprobs.f.data(), dweights.f.data(), probs_ref.data(), w_ref.data(),
                            ex_ref.data(), T, E, k);
  Bits dl(T * E);
  cpu::router_topk_backward(out(dl), in(dprobs.bits), in(dweights.bits), in(probs_ref), in(w_ref), ex_ref.data(), T,
                            E, k);
  check("router_topk_backward dlogits", nmse(dl, dl_ref));

  // permute (capacity 3, drop policy probs: f32 routing weights rank the assignments)
  Rounded x = rounded(rng, T * H);
  const int64_t cap = 3;
  VecF rows_ref(N * H);
  Ints counts_ref(E), counts(E), row_of_ref(T * k), row_of(T * k);
  cpu::moe_permute_forward(rows_ref.data(), counts_ref.data(), row_of_ref.data(), x.f.data(), ex_ref.data(), T, H, k,
                           E, N, cap, w_ref.data());
  Bits rows(N * H);
  cpu::moe_permute_forward(out(rows), counts.data(), row_of.data(), in(x.bits), ex_ref.data(), T, H, k, E, N, cap,
                           in(w_ref));
  check("moe_permute_forward rows",
        nmse(rows, rows_ref) + (counts == counts_ref && row_of == row_of_ref ? 0.0 : 1.0));
  Rounded drows = rounded(rng, N * H);
  VecF dx_ref(T * H);
  cpu::moe_permute_backward(dx_ref.data(), drows.f.data(), row_of_ref.data(), T, H, k, N);
  Bits dx(T * H);
  cpu::moe_permute_backward(out(dx), in(drows.bits), row_of_ref.data(), T, H, k, N);
  check("moe_permute_backward dx", nmse(dx, dx_ref));

  // unpermute: bf16 rows, f32 weights → bf16 tokens
  const VecF rows_f = floats_of(rows);
  VecF y_ref(T * H);
  cpu::moe_unpermute_forward(y_ref.data(), rows_f.data(), row_of_ref.data(), w_ref.data(), T, k, N, H);
  Bits y(T * H);
  cpu::moe_unpermute_forward(out(y), in(rows), row_of_ref.data(), in(w_ref), T, k, N, H);
  check("moe_unpermute_forward y", nmse(y, y_ref));
  Rounded dy = rounded(rng, T * H);
  VecF drows_ref(N * H), dw_ref(T * k), dw(T * k);
  cpu::moe_unpermute_backward(drows_ref.data(), dw_ref.data(), dy.f.data(), rows_f.data(), row_of_ref.data(),
                              w_ref.data(), T, k, N, H);
  Bits drows_out(N * H);
  cpu::moe_unpermute_backward(out(drows_out), out(dw), in(dy.bits), in(rows), row_of_ref.data(), in(w_ref), T, k, N,
                              H);
  check("moe_unpermute_backward drows", nmse(drows_out, drows_ref));
  check("moe_unpermute_backward dweights f32", nmse(dw, dw_ref));

  // aux loss on bf16 probs; its gradient accumulates into bf16 dprobs
  const Ints seg = {0, 0, 0, 1, 1, 1, 1, -1, 2, 2};
  const double loss_ref = cpu::moe_aux_loss_forward(probs_bf.data(), ex_ref.data(), seg.data(), T, E, k, 0.01);
  const double loss = cpu::moe_aux_loss_forward(in(probs_b), ex_ref.data(), seg.data(), T, E, k, 0.01);
  check("moe_aux_loss_forward loss", nmse(loss, loss_ref));
  Rounded start = rounded(rng, T * E, -1e-3, 1e-3);
  VecF dp_ref = start.f;
  Bits dp = start.bits;
  cpu::moe_aux_loss_backward(dp_ref.data(), 0.7f, ex_ref.data(), seg.data(), T, E, k, 0.01);
  cpu::moe_aux_loss_backward(out(dp), 0.7, ex_ref.data(), seg.data(), T, E, k, 0.01);
  check("moe_aux_loss_backward dprobs (accumulating)", nmse(dp, dp_ref));

  // expert-parallel chunk sort: a permutation of bf16 rows
  const Ints chunk = {2, 1, 0, 3, 1, 2};  // (P 2, L 3), 9 of 12 rows
  Rounded cx = rounded(rng, 12 * H);
  VecF cy_ref(12 * H);
  cpu::moe_sort_chunks(cy_ref.data(), cx.f.data(), chunk.data(), 2, 3, 12, H, false);
  Bits cy(12 * H);
  cpu::moe_sort_chunks(out(cy), in(cx.bits), chunk.data(), 2, 3, 12, H, false);
  check("moe_sort_chunks y", nmse(cy, cy_ref));
}

// ---- losses --------------------------------------------------------------------------------------

void bf16_losses() {
  const int64_t T = 8, V = 40;
  Rng rng(73);
  Rounded logits = rounded(rng, T * V, -5, 5);
  const Ints labels = {1, 39, 0, 7, 7, 20, 3, 11};
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 1, 1, 0, 1};
  const double tokens = 11;
  // cross_entropy: bf16 logits, f32 lse and loss, bf16 dlogits
  VecF lse_ref(T), lse(T);
  const double loss_ref =
      cpu::cross_entropy_forward(lse_ref.data(), logits.f.data(), labels.data(), mask.data(), tokens, T, V);
  const double loss = cpu::cross_entropy_forward(out(lse), in(logits.bits), labels.data(), mask.data(), tokens, T, V);
  check("cross_entropy_forward loss", nmse(loss, loss_ref));
  check("cross_entropy_forward lse f32", nmse(lse, lse_ref));
  VecF dl_ref(T * V);
  cpu::cross_entropy_backward(dl_ref.data(), 1.3f, logits.f.data(), lse_ref.data(), labels.data(), mask.data(), tokens,
                              T, V);
  Bits dl(T * V);
  cpu::cross_entropy_backward(out(dl), 1.3, in(logits.bits), in(lse_ref), labels.data(), mask.data(), tokens, T, V);
  check("cross_entropy_backward dlogits", nmse(dl, dl_ref));

  // vocab-parallel pieces (this rank: columns [40, 80) of 120)
  VecF vl_ref(T), vl(T);
  cpu::vocab_logsumexp_forward(vl_ref.data(), logits.f.data(), T, V);
  cpu::vocab_logsumexp_forward(out(vl), in(logits.bits), T, V);
  check("vocab_logsumexp_forward lse f32", nmse(vl, vl_ref));
  const VecF dyT = to_float(rng.vec(T));
  cpu::vocab_logsumexp_backward(dl_ref.data(), dyT.data(), logits.f.data(), vl_ref.data(), T, V);
  cpu::vocab_logsumexp_backward(out(dl), in(dyT), in(logits.bits), in(vl_ref), T, V);
  check("vocab_logsumexp_backward dlogits", nmse(dl, dl_ref));

  const int64_t P = 3;
  Rounded parts = rounded(rng, P * T, 0, 4);  // bf16 per-rank lse (a mix: the plan keeps them f32)
  VecF comb_ref(T), comb(T);
  cpu::lse_combine_forward(comb_ref.data(), parts.f.data(), P, T);
  cpu::lse_combine_forward(out(comb), in(parts.bits), P, T);
  check("lse_combine_forward y f32 from bf16", nmse(comb, comb_ref));
  VecF dparts_ref(P * T);
  cpu::lse_combine_backward(dparts_ref.data(), dyT.data(), parts.f.data(), comb_ref.data(), P, T);
  Bits dparts(P * T);
  cpu::lse_combine_backward(out(dparts), in(dyT), in(parts.bits), in(comb_ref), P, T);
  check("lse_combine_backward dx", nmse(dparts, dparts_ref));

  const Ints vlabels = {41, 79, 0, 47, 119, 60, 43, 40};
  VecF tgt_ref(T), tgt(T);
  cpu::vocab_target_logit_forward(tgt_ref.data(), logits.f.data(), vlabels.data(), mask.data(), T, V, 40, 120);
  cpu::vocab_target_logit_forward(out(tgt), in(logits.bits), vlabels.data(), mask.data(), T, V, 40, 120);
  check("vocab_target_logit_forward target f32", nmse(tgt, tgt_ref));
  cpu::vocab_target_logit_backward(dl_ref.data(), dyT.data(), vlabels.data(), mask.data(), T, V, 40, 120);
  cpu::vocab_target_logit_backward(out(dl), in(dyT), vlabels.data(), mask.data(), T, V, 40, 120);
  check("vocab_target_logit_backward dlogits", nmse(dl, dl_ref));

  Rounded target = rounded(rng, T, -2, 2);  // a bf16 target (a mix)
  const double ce_ref = cpu::ce_from_stats_forward(vl_ref.data(), target.f.data(), mask.data(), tokens, T);
  const double ce = cpu::ce_from_stats_forward(in(vl_ref), in(target.bits), mask.data(), tokens, T);
  check("ce_from_stats_forward loss", nmse(ce, ce_ref));
  VecF dlse_ref(T), dtgt_ref(T);
  cpu::ce_from_stats_backward(dlse_ref.data(), dtgt_ref.data(), 0.9f, mask.data(), tokens, T);
  Bits dlse(T), dtgt(T);
  cpu::ce_from_stats_backward(out(dlse), out(dtgt), 0.9, mask.data(), tokens, T);
  check("ce_from_stats_backward dlse, dtarget", std::max(nmse(dlse, dlse_ref), nmse(dtgt, dtgt_ref)));
}

// ---- merge, rows, optimizer ----------------------------------------------------------------------

void bf16_merge_and_rows() {
  const int64_t T = 7, Nv = 3, H = 4;
  const Ints tokens = {5, 1, 1, 9, 1, 2, 3};
  Rng rng(79);
  Rounded text = rounded(rng, T * H), vis = rounded(rng, Nv * H), dy = rounded(rng, T * H);
  for (cpu::MergeMode mode : {cpu::MergeMode::Replace, cpu::MergeMode::Add}) {
    const std::string m = mode == cpu::MergeMode::Add ? " (add)" : " (replace)";
    VecF y_ref(T * H);
    cpu::merge_visual_forward(y_ref.data(), text.f.data(), vis.f.data(), tokens.data(), 1, mode, T, Nv, H);
    Bits y = text.bits;  // in place, as the plan runs it
    cpu::merge_visual_forward(out(y), in(y), in(vis.bits), tokens.data(), 1, mode, T, Nv, H);
    check("merge_visual_forward y" + m, nmse(y, y_ref));
    VecF dt_ref(T * H), dv_ref(Nv * H);
    cpu::merge_visual_backward(dt_ref.data(), dv_ref.data(), dy.f.data(), tokens.data(), 1, mode, T, Nv, H);
    Bits dt(T * H), dv(Nv * H);
    cpu::merge_visual_backward(out(dt), out(dv), in(dy.bits), tokens.data(), 1, mode, T, Nv, H);
    check("merge_visual_backward dtext, dvisual" + m, std::max(nmse(dt, dt_ref), nmse(dv, dv_ref)));
  }
  // scatter_rows (the gradient of gather_rows): bf16 rows into an f32 gradient, repeats summed
  const Ints index = {2, 0, 2, 4};
  Rounded rows = rounded(rng, 4 * H);
  VecF sx_ref(5 * H), sx(5 * H);
  cpu::scatter_rows(sx_ref.data(), rows.f.data(), index.data(), 4, 5, H);
  cpu::scatter_rows(out(sx), in(rows.bits), index.data(), 4, 5, H);
  check("scatter_rows dx f32", nmse(sx, sx_ref));
}

void bf16_optimizer() {
  const int64_t n = 257;
  Rng rng(83);
  // grad_accumulate: a bf16 gradient into the f32 main gradient, and bf16 into bf16
  Rounded g = rounded(rng, n);
  VecF acc = to_float(rng.vec(n)), acc_ref = acc;
  cpu::grad_accumulate(acc_ref.data(), g.f.data(), n);
  cpu::grad_accumulate(out(acc), in(g.bits), n);
  check("grad_accumulate acc f32 += bf16", nmse(acc, acc_ref));
  Rounded acc_b = rounded(rng, n);
  VecF accb_ref = acc_b.f;
  cpu::grad_accumulate(accb_ref.data(), g.f.data(), n);
  cpu::grad_accumulate(out(acc_b.bits), in(g.bits), n);
  check("grad_accumulate acc bf16 += bf16", nmse(acc_b.bits, accb_ref));
  // sum_squares of a bf16 buffer (in double)
  check("sum_squares of bf16", nmse(cpu::sum_squares(in(g.bits), n), cpu::sum_squares(g.f.data(), n)));

  // AdamW with an fp32 master: 3 steps; master, m, v f32, grad f32 then bf16; param bf16 = round(master)
  const cpu::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5};
  VecF master = to_float(rng.vec(n)), m(n, 0.f), v(n, 0.f);
  VecF master_ref = master, m_ref = m, v_ref = v;
  Bits param = bits_of(master);
  double err_master = 0, err_param = 0;
  for (int64_t t = 1; t <= 3; t++) {
    Rounded grad = rounded(rng, n, -2, 2);
    cpu::adamw_step(master_ref.data(), grad.f.data(), m_ref.data(), v_ref.data(), n, hp, t);
    if (t < 3)
      cpu::adamw_step_master(out(param), out(master), in(grad.f), out(m), out(v), n, hp, t);
    else
      cpu::adamw_step_master(out(param), out(master), in(grad.bits), out(m), out(v), n, hp, t);
    track_max(err_master, std::max({nmse(master, master_ref), nmse(m, m_ref), nmse(v, v_ref)}));
    track_max(err_param, nmse(param, master_ref));
  }
  check("adamw_step_master master, m, v f32 (3 steps)", err_master);
  check("adamw_step_master param bf16 = round(master)", err_param);
  report_bool("bf16/adamw_step_master param is exactly round(master)", same_bits(param, bits_of(master)));
}

// ---- errors ------------------------------------------------------------------------------------

void bf16_errors() {
  VecF f(8, 1.f);
  std::vector<double> d(8, 1.0);
  Bits b(8);
  report_bool("err/f64 mixed with f32 operands", throws_kernel_error([&] {
                cpu::add_forward(cpu::Dst{d.data(), DType::f64}, in(f), in(f), 8);
              }, "add_forward: 1 f64 operands mixed with 2 f32/bf16 ones"));
  report_bool("err/an f16 operand", throws_kernel_error([&] {
                cpu::gelu_forward(out(f), cpu::Src{b.data(), DType::f16}, 8);
              }, "gelu_forward: an operand has dtype f16"));
  report_bool("err/adamw_step on a bf16 param without master", throws_kernel_error([&] {
                cpu::adamw_step(out(b), in(f), out(f), out(f), 8, cpu::AdamWParams{1e-3}, 1);
              }, "a bf16 parameter needs its fp32 master"));
  // a core that throws leaves a staged bf16 output untouched
  Bits y = bits_of(VecF(4 * 2, 3.f));
  const Bits before = y;
  const Ints bad = {0, 9};
  const bool threw = throws_kernel_error([&] {
    cpu::embedding_backward(out(y), in(bits_of(VecF(4, 1.f))), bad.data(), 2, 4, 2);
  }, "embedding_backward: ids[1] = 9");
  report_bool("err/a throwing kernel leaves its bf16 output untouched", threw && same_bits(y, before));
}

// ---- the conversion, exactly -----------------------------------------------------------------------

uint16_t bits(float f) { return lfc::toBf16(f).bits; }
float of_bits(uint32_t u) { return lfc::floatOfBits(u); }

void bf16_conversion() {
  struct Case {
    uint32_t in;
    uint16_t want;
    const char* what;
  };
  const std::vector<Case> cases = {
      {0x3f800000u, 0x3f80, "1.0 exact"},
      {0x3f808000u, 0x3f80, "tie, even kept part: down"},
      {0x3f818000u, 0x3f82, "tie, odd kept part: up"},
      {0x3f808001u, 0x3f81, "just above the tie: up"},
      {0x3f807fffu, 0x3f80, "just below the tie: down"},
      {0xbf818000u, 0xbf82, "negative tie, odd: away from 0"},
      {0x7f7fffffu, 0x7f80, "largest float: rounds to inf"},
      {0x7f7f7fffu, 0x7f7f, "largest bf16, below the tie: stays"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x7fc00000u, 0x7fc0, "quiet NaN"},
      {0x7f800001u, 0x7fc0, "signaling NaN, low payload: quiet, not inf"},
      {0x7fa00000u, 0x7fe0, "signaling NaN, high payload: kept, quiet"},
      {0xff800001u, 0xffc0, "negative NaN keeps its sign"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x00008000u, 0x0000, "denormal tie, even: to 0"},
      {0x00018000u, 0x0002, "denormal tie, odd: up"},
      {0x00010000u, 0x0001, "smallest bf16 denormal"},
      {0x00007fffu, 0x0000, "below half the smallest denormal"},
      {0x007fffffu, 0x0080, "largest float denormal: to the smallest normal"},
  };
  int wrong = 0;
  for (const Case& c : cases)
    if (bits(of_bits(c.in)) != c.want) {
      std::printf("  bf16 of %08x: %04x, expected %04x (%s)\n", c.in, bits(of_bits(c.in)), c.want, c.what);
      wrong++;
    }
  report("bf16/convert float → bf16: ties, NaN, inf, denormals (cases wrong)", wrong, 0.0);

  // every bf16 value: to float is exact (the 16 bits appended), and back is the same bits (NaN: quiet)
  int exact_wrong = 0, back_wrong = 0;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float f = lfc::toFloat(bf16{uint16_t(h)});
    if (lfc::floatBits(f) != h << 16) exact_wrong++;
    const bool nan = (h & 0x7fffu) > 0x7f80u;
    if (bits(f) != (nan ? (h | 0x0040u) : h)) back_wrong++;
  }
  report("bf16/convert bf16 → float exact, all 65536 (wrong)", exact_wrong, 0.0);
  report("bf16/convert bf16 → float → bf16 round trip, all 65536 (wrong)", back_wrong, 0.0);

  // against RNE computed in double on random floats: bf16(x) is the nearest bf16, ties to even
  Rng rng(89);
  int rne_wrong = 0;
  for (int i = 0; i < 200000; i++) {
    const uint32_t u = uint32_t(rng.gen()) & 0xff7fffffu;  // finite, both signs, any exponent
    const float x = of_bits(u);
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // the bf16 values either side of x
    // hi may be ±inf: as a distance it counts as ±2^128, where the exponent range would continue
    const double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), double(x))
                                                         : double(of_bits(hi));
    const double dlo = std::abs(double(x) - double(of_bits(lo))), dhi = std::abs(vhi - double(x));
    const uint32_t want = dlo < dhi ? lo : dhi < dlo ? hi : (((lo >> 16) & 1) ? hi : lo);
    if (bits(x) != uint16_t(want >> 16)) rne_wrong++;
  }
  report("bf16/convert float → bf16 nearest-even, 200000 random (wrong)", rne_wrong, 0.0);

  // bulk helpers and cpu::convert equal the scalar rule
  const VecF xs = to_float(rng.vec(1000, -1e5, 1e5));
  Bits bulk(xs.size()), via(xs.size());
  lfc::bf16FromFloat(bulk.data(), xs.data(), int64_t(xs.size()));
  cpu::convert(out(via), in(xs), int64_t(xs.size()));
  int bulk_wrong = 0;
  for (size_t i = 0; i < xs.size(); i++) bulk_wrong += bulk[i].bits != bits(xs[i]) || via[i].bits != bulk[i].bits;
  std::vector<double> ds(xs.size());
  cpu::convert(cpu::Dst{ds.data(), DType::f64}, in(bulk), int64_t(xs.size()));
  for (size_t i = 0; i < xs.size(); i++) bulk_wrong += ds[i] != double(lfc::toFloat(bulk[i]));
  report("bf16/convert bulk and cpu::convert = the scalar rule (wrong)", bulk_wrong, 0.0);
}

}  // namespace

void bf16_checks() {
  bf16_conversion();
  bf16_linear();
  bf16_grouped_linear();
  bf16_norms();
  bf16_embedding();
  bf16_activations();
  bf16_rope();
  bf16_attention();
  bf16_moe();
  bf16_losses();
  bf16_merge_and_rows();
  bf16_optimizer();
  bf16_errors();
}
