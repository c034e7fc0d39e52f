// kernel_check: numerical checks of the CPU kernels (runtime-native/src/kernels/cpu), by tier:
//   fd/...      every backward against central finite differences in double (objective
//               Σ random coefficients · outputs; error = max|analytic − fd| / max|fd|, max over seeds)
//   ref/...     every optimized kernel against its lfc::cpu::ref version in float on random inputs
//               and edge cases (error = max|opt − ref| / max|ref|)
//   fwd/...     forwards of the single-implementation kernels against the formula, evaluated here
//               independently (long double), or against hand-worked cases
//   pool/...    the kernel thread pool, and every pooled kernel against its ref loop and against
//               itself at 1, 2 and 3 threads byte for byte (pool_check.cc)
//   bf16/...    every kernel's entry point on bf16 storage against the f32 kernel on the same
//               bf16-rounded inputs (error = NMSE), and the bf16 conversion exactly (bf16_check.cc)
//   err/...     bad arguments throw KernelError
// One line per check: name, max error, tolerance, PASS/FAIL; exit status 1 on any failure.
// `kernel_check --bench` times optimized against reference versions instead.

#include <cblas.h>
#include "check.h"

// ---- finite-difference checks of every backward (double) --------------------------------------

void fd_linear() {
  FdReport rep{"linear", {}};
  const int64_t N = 5, in = 4, out = 3;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec x = rng.vec(N * in), w = rng.vec(out * in), b = rng.vec(out), c = rng.vec(N * out);
    Vec y(N * out);
    auto f = [&] {
      cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), N, in, out);
      return dot(c, y);
    };
    Vec dx(N * in), dw(out * in, 0.0), db(out, 0.0);
    cpu::linear_backward_data(dx.data(), c.data(), w.data(), N, in, out);
    cpu::linear_backward_weight(dw.data(), db.data(), c.data(), x.data(), N, in, out);
    rep.add("dx", fd_error(x, dx, f));
    rep.add("dw", fd_error(w, dw, f));
    rep.add("db", fd_error(b, db, f));
  }
  rep.print();
}

void fd_grouped_linear() {
  FdReport rep{"grouped_linear", {}};
  const int64_t E = 4, N = 7, in = 3, out = 4;
  const Ints counts = {2, 0, 3, 1};  // an expert without rows; row 6 is past Σ counts
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec x = rng.vec(N * in), w = rng.vec(E * out * in), c = rng.vec(N * out);
    Vec y(N * out);
    auto ptrs = [&](Vec& buf) {
      std::vector<double*> p;
      for (int64_t e = 0; e < E; e++) p.push_back(buf.data() + e * out * in);
      return p;
    };
    auto f = [&] {
      auto wp = ptrs(w);
      std::vector<const double*> cw(wp.begin(), wp.end());
      cpu::grouped_linear_forward(y.data(), x.data(), counts.data(), cw.data(), E, N, in, out);
      return dot(c, y);
    };
    Vec dx(N * in), dw(E * out * in, 0.0);
    auto wp = ptrs(w), dwp = ptrs(dw);
    std::vector<const double*> cw(wp.begin(), wp.end());
    cpu::grouped_linear_backward_data(dx.data(), c.data(), counts.data(), cw.data(), E, N, in, out);
    cpu::grouped_linear_backward_weight(dwp.data(), c.data(), x.data(), counts.data(), E, N, in, out);
    rep.add("dx", fd_error(x, dx, f));
    rep.add("dw", fd_error(w, dw, f));
  }
  rep.print();
}

void fd_norms() {
  FdReport ln{"layernorm", {}}, rms{"rmsnorm", {}};
  const int64_t R = 3, H = 6;
  const double eps = 1e-5;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec x = rng.vec(R * H, -2, 2), w = rng.vec(H), b = rng.vec(H), c = rng.vec(R * H);
    Vec y(R * H), mean(R), rstd(R);
    auto f_ln = [&] {
      cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, H, eps);
      return dot(c, y);
    };
    f_ln();
    Vec dx(R * H), dw(H, 0.0), db(H, 0.0);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), c.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), R, H);
    ln.add("dx", fd_error(x, dx, f_ln));
    ln.add("dw", fd_error(w, dw, f_ln));
    ln.add("db", fd_error(b, db, f_ln));

    auto f_rms = [&] {
      cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), R, H, eps);
      return dot(c, y);
    };
    f_rms();
    std::fill(dw.begin(), dw.end(), 0.0);
    cpu::rmsnorm_backward(dx.data(), dw.data(), c.data(), x.data(), w.data(), rstd.data(), R, H);
    rms.add("dx", fd_error(x, dx, f_rms));
    rms.add("dw", fd_error(w, dw, f_rms));
  }
  ln.print();
  rms.print();
}

void fd_embedding() {
  FdReport rep{"embedding", {}};
  const int64_t T = 6, V = 5, H = 3;
  const Ints ids = {4, 0, 4, 2, 2, 4};  // repeats sum
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec table = rng.vec(V * H), c = rng.vec(T * H), y(T * H);
    auto f = [&] {
      cpu::embedding_forward(y.data(), ids.data(), table.data(), T, V, H);
      return dot(c, y);
    };
    Vec dtable(V * H, 0.0);
    cpu::embedding_backward(dtable.data(), c.data(), ids.data(), T, V, H);
    rep.add("dtable", fd_error(table, dtable, f));
  }
  rep.print();
}

void fd_activations() {
  FdReport gelu{"gelu", {}}, swiglu{"swiglu", {}}, add{"add", {}};
  const int64_t n = 16;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec x = rng.vec(n, -4, 4), u = rng.vec(n, -2, 2), c = rng.vec(n), y(n), dx(n), du(n);
    auto f_gelu = [&] {
      cpu::gelu_forward(y.data(), x.data(), n);
      return dot(c, y);
    };
    cpu::gelu_backward(dx.data(), c.data(), x.data(), n);
    gelu.add("dx", fd_error(x, dx, f_gelu));

    auto f_swiglu = [&] {
      cpu::swiglu_forward(y.data(), x.data(), u.data(), n);
      return dot(c, y);
    };
    cpu::swiglu_backward(dx.data(), du.data(), c.data(), x.data(), u.data(), n);
    swiglu.add("dgate", fd_error(x, dx, f_swiglu));
    swiglu.add("dup", fd_error(u, du, f_swiglu));

    auto f_add = [&] {
      cpu::add_forward(y.data(), x.data(), u.data(), n);
      return dot(c, y);
    };
    cpu::add_backward(dx.data(), du.data(), c.data(), n);
    add.add("da", fd_error(x, dx, f_add));
    add.add("db", fd_error(u, du, f_add));
  }
  gelu.print();
  swiglu.print();
  add.print();
}

void fd_rope() {
  FdReport plain{"rope P=1", {}}, sections{"rope P=3", {}};
  const int64_t T = 4, nh = 2, d = 8;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    for (auto* rep : {&plain, &sections}) {
      const Ints secs = rep == &plain ? Ints{4} : Ints{1, 2, 1};
      const int64_t P = int64_t(secs.size());
      const Ints pos = rng.ints(T * P, 0, 20);
      Vec x = rng.vec(T * nh * d), c = rng.vec(T * nh * d), y(T * nh * d), dx(T * nh * d);
      auto f = [&] {
        cpu::rope_forward(y.data(), x.data(), pos.data(), secs.data(), P, T, nh, d, 1e4);
        return dot(c, y);
      };
      cpu::rope_backward(dx.data(), c.data(), pos.data(), secs.data(), P, T, nh, d, 1e4);
      rep->add("dx", fd_error(x, dx, f));
    }
  }
  plain.print();
  sections.print();
}

struct AttentionCase {
  std::string name;
  int64_t nh, nkv, d;
  bool causal;
  std::vector<std::pair<int32_t, int>> runs;  // (segment id, length)
};

void fd_attention() {
  const std::vector<AttentionCase> cases = {
      {"causal g=2 pad+1tok", 4, 2, 4, true, {{0, 4}, {1, 1}, {2, 5}, {-1, 2}}},
      {"bidir g=4 pad", 4, 1, 3, false, {{0, 3}, {1, 6}, {-1, 3}}},
      {"causal g=1", 2, 2, 5, true, {{0, 7}, {1, 3}}},
      {"causal 2 row blocks", 2, 1, 2, true, {{0, 80}}},
      {"bidir non-contiguous ids", 2, 1, 3, false, {{0, 3}, {1, 2}, {0, 3}, {-1, 1}}},
  };
  for (const AttentionCase& ac : cases) {
    FdReport rep{"attention " + ac.name, {}};
    const Ints seg = segments_of(ac.runs);
    const int64_t T = int64_t(seg.size()), nh = ac.nh, nkv = ac.nkv, d = ac.d;
    const double scale = 1.0 / std::sqrt(double(d));
    for (uint64_t seed : kSeeds) {
      if (T > 40 && seed != kSeeds[0]) continue;  // the long case: one seed keeps the run short
      Rng rng(seed);
      Vec q = rng.vec(T * nh * d, -2, 2), k = rng.vec(T * nkv * d, -2, 2), v = rng.vec(T * nkv * d);
      Vec c = rng.vec(T * nh * d), out(T * nh * d), lse(T * nh);
      auto f = [&] {
        cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), T, nh,
                               nkv, d, scale, ac.causal);
        return dot(c, out);
      };
      f();
      Vec dq(q.size()), dk(k.size()), dv(v.size());
      cpu::attention_backward(dq.data(), dk.data(), dv.data(), c.data(), q.data(), k.data(), v.data(),
                              out.data(), lse.data(), seg.data(), T, nh, nkv, d, scale, ac.causal);
      rep.add("dq", fd_error(q, dq, f));
      rep.add("dk", fd_error(k, dk, f));
      rep.add("dv", fd_error(v, dv, f));
    }
    rep.print();
  }
}

void fd_router_topk() {
  FdReport both{"router_topk", {}}, weights_only{"router_topk dprobs=null", {}};
  const int64_t T = 5, E = 6, k = 2;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec logits = rng.vec(T * E, -3, 3), cp = rng.vec(T * E), cw = rng.vec(T * k);
    Vec probs(T * E), weights(T * k);
    Ints experts(T * k);
    cpu::router_topk_forward(probs.data(), weights.data(), experts.data(), logits.data(), T, E, k);
    const Ints chosen = experts;
    bool selection_moved = false;  // the check holds the selection fixed; a step must not flip it
    for (auto* rep : {&both, &weights_only}) {
      const bool with_probs = rep == &both;
      auto f = [&] {
        cpu::router_topk_forward(probs.data(), weights.data(), experts.data(), logits.data(), T, E, k);
        selection_moved |= experts != chosen;
        return (with_probs ? dot(cp, probs) : 0.0) + dot(cw, weights);
      };
      f();
      Vec dlogits(T * E);
      cpu::router_topk_backward(dlogits.data(), with_probs ? cp.data() : nullptr, cw.data(), probs.data(),
                                weights.data(), experts.data(), T, E, k);
      rep->add("dlogits", fd_error(logits, dlogits, f));
    }
    both.add("selection fixed", selection_moved ? INFINITY : 0.0);
  }
  both.print();
  weights_only.print();
}

// capacity < 0: no assignment dropped; capacity 2 drops about a third of them here (T·k = 10
// assignments over 3 experts), so the gradients of dropped assignments are checked to be zero.
void fd_moe_permute(int64_t capacity) {
  const std::string tag = capacity < 0 ? "" : " capacity " + std::to_string(capacity);
  FdReport perm{"moe_permute" + tag, {}}, unperm{"moe_unpermute" + tag, {}};
  const int64_t T = 5, H = 3, k = 2, E = 4, N = T * k;
  int64_t dropped = 0;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Ints experts(T * k);
    for (int64_t t = 0; t < T; t++) {  // two distinct experts per token, expert 3 never chosen
      experts[t * k] = rng.integer(0, 2);
      experts[t * k + 1] = (experts[t * k] + rng.integer(1, 2)) % 3;
    }
    Vec x = rng.vec(T * H), c = rng.vec(N * H), rows(N * H);
    Ints counts(E), row_of(T * k);
    auto f_perm = [&] {
      cpu::moe_permute_forward(rows.data(), counts.data(), row_of.data(), x.data(), experts.data(), T, H, k, E, N,
                               capacity);
      return dot(c, rows);
    };
    f_perm();
    dropped += std::count(row_of.begin(), row_of.end(), -1);
    Vec dx(T * H);
    cpu::moe_permute_backward(dx.data(), c.data(), row_of.data(), T, H, k, N);
    perm.add("dx", fd_error(x, dx, f_perm));

    Vec r = rng.vec(N * H), w = rng.vec(T * k, 0, 1), cy = rng.vec(T * H), y(T * H);
    auto f_unperm = [&] {
      cpu::moe_unpermute_forward(y.data(), r.data(), row_of.data(), w.data(), T, k, N, H);
      return dot(cy, y);
    };
    Vec drows(N * H), dweights(T * k);
    cpu::moe_unpermute_backward(drows.data(), dweights.data(), cy.data(), r.data(), row_of.data(), w.data(),
                                T, k, N, H);
    unperm.add("drows", fd_error(r, drows, f_unperm));
    unperm.add("dweights", fd_error(w, dweights, f_unperm));
  }
  perm.print();
  unperm.print();
  if (capacity >= 0) report_bool("fd/moe_permute" + tag + " drops assignments", dropped > 0);
}

void fd_moe_aux_loss() {
  FdReport rep{"moe_aux_loss", {}};
  const int64_t T = 7, E = 4, k = 2;
  const Ints seg = segments_of({{0, 3}, {1, 2}, {-1, 2}});
  const double coeff = 0.37;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec probs = rng.vec(T * E, 0, 1);  // any values: the loss is linear in probs
    Ints experts(T * k);
    for (int64_t t = 0; t < T; t++) {
      experts[t * k] = rng.integer(0, 3);
      experts[t * k + 1] = (experts[t * k] + rng.integer(1, 3)) % 4;
    }
    const double g = rng.uniform(0.5, 2);  // upstream gradient of the loss
    auto f = [&] { return g * cpu::moe_aux_loss_forward(probs.data(), experts.data(), seg.data(), T, E, k, coeff); };
    const Vec base = rng.vec(T * E);  // backward accumulates: start from a nonzero buffer
    Vec dprobs = base;
    cpu::moe_aux_loss_backward(dprobs.data(), g, experts.data(), seg.data(), T, E, k, coeff);
    for (int64_t i = 0; i < T * E; i++) dprobs[i] -= base[i];
    rep.add("dprobs (accumulated)", fd_error(probs, dprobs, f));
  }
  rep.print();
}

void fd_cross_entropy() {
  FdReport rep{"cross_entropy", {}};
  const int64_t T = 6, V = 7;
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 1};
  const double loss_tokens = 9;  // the global batch's count, not this microbatch's
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec logits = rng.vec(T * V, -3, 3), lse(T);
    Ints labels = rng.ints(T, 0, int32_t(V - 1));
    const double g = rng.uniform(0.5, 2);
    auto f = [&] {
      return g * cpu::cross_entropy_forward(lse.data(), logits.data(), labels.data(), mask.data(), loss_tokens, T, V);
    };
    f();
    Vec dlogits(T * V);
    cpu::cross_entropy_backward(dlogits.data(), g, logits.data(), lse.data(), labels.data(), mask.data(),
                                loss_tokens, T, V);
    rep.add("dlogits", fd_error(logits, dlogits, f));
  }
  rep.print();
}

// Vocab-parallel embedding: the table is rows [r·V, (r+1)·V) of a vocabulary of P·V, at ranks 0
// and 1 of 2; ids of the other block give zero rows and no gradient.
void fd_embedding_shard() {
  const int64_t T = 7, V = 3, H = 2, P = 2;
  const Ints ids = {4, 0, 4, 2, 5, 1, 2};  // both blocks, repeats
  for (int64_t r = 0; r < P; r++) {
    FdReport rep{"embedding vocab shard rank " + std::to_string(r) + " of 2", {}};
    for (uint64_t seed : kSeeds) {
      Rng rng(seed);
      Vec table = rng.vec(V * H), c = rng.vec(T * H), y(T * H);
      auto f = [&] {
        cpu::embedding_shard_forward(y.data(), ids.data(), table.data(), T, V, H, r * V, P * V);
        return dot(c, y);
      };
      const Vec base = rng.vec(V * H);  // backward accumulates
      Vec dtable = base;
      cpu::embedding_shard_backward(dtable.data(), c.data(), ids.data(), T, V, H, r * V, P * V);
      for (int64_t i = 0; i < V * H; i++) dtable[i] -= base[i];
      rep.add("dtable (accumulated)", fd_error(table, dtable, f));
    }
    rep.print();
  }
}

// The vocab-parallel cross-entropy pieces, each against finite differences; vocab_target_logit at
// ranks 0 and 1 of 2, with and without a mask.
void fd_vocab_parallel() {
  const int64_t T = 5, V = 4, P = 3;
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0};
  FdReport lse_rep{"vocab_logsumexp", {}}, comb{"lse_combine", {}}, ce{"ce_from_stats", {}};
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    Vec logits = rng.vec(T * V, -3, 3), lse(T), c = rng.vec(T);
    auto f_lse = [&] {
      cpu::vocab_logsumexp_forward(lse.data(), logits.data(), T, V);
      return dot(c, lse);
    };
    f_lse();
    Vec dlogits(T * V);
    cpu::vocab_logsumexp_backward(dlogits.data(), c.data(), logits.data(), lse.data(), T, V);
    lse_rep.add("dlogits", fd_error(logits, dlogits, f_lse));

    Vec x = rng.vec(P * T, -3, 3), y(T);
    auto f_comb = [&] {
      cpu::lse_combine_forward(y.data(), x.data(), P, T);
      return dot(c, y);
    };
    f_comb();
    Vec dx(P * T);
    cpu::lse_combine_backward(dx.data(), c.data(), x.data(), y.data(), P, T);
    comb.add("dx", fd_error(x, dx, f_comb));

    Vec l = rng.vec(T, 1, 3), tg = rng.vec(T, -1, 1);
    const double g = rng.uniform(0.5, 2), loss_tokens = 7;
    auto f_ce = [&] { return g * cpu::ce_from_stats_forward(l.data(), tg.data(), mask.data(), loss_tokens, T); };
    Vec dl(T), dt(T);
    cpu::ce_from_stats_backward(dl.data(), dt.data(), g, mask.data(), loss_tokens, T);
    ce.add("dlse", fd_error(l, dl, f_ce));
    ce.add("dtarget", fd_error(tg, dt, f_ce));
  }
  lse_rep.print();
  comb.print();
  ce.print();

  const Ints labels = {1, 6, 3, 5, 7};  // vocabulary 2·V = 8: labels in both blocks
  for (int64_t r = 0; r < 2; r++)
    for (const uint8_t* m : {static_cast<const uint8_t*>(nullptr), mask.data()}) {
      FdReport rep{"vocab_target_logit rank " + std::to_string(r) + " of 2" + (m ? ", masked" : ""), {}};
      for (uint64_t seed : kSeeds) {
        Rng rng(seed);
        Vec logits = rng.vec(T * V, -3, 3), tgt(T), c = rng.vec(T);
        auto f = [&] {
          cpu::vocab_target_logit_forward(tgt.data(), logits.data(), labels.data(), m, T, V, r * V, 2 * V);
          return dot(c, tgt);
        };
        Vec dlogits(T * V, 5.0);  // overwritten
        cpu::vocab_target_logit_backward(dlogits.data(), c.data(), labels.data(), m, T, V, r * V, 2 * V);
        rep.add("dlogits", fd_error(logits, dlogits, f));
      }
      rep.print();
    }
}

void fd_moe_sort_chunks() {
  const int64_t P = 2, L = 3, N = 13, H = 2;
  const Ints counts = {2, 0, 3, 1, 4, 1};  // Σ = 11 < N: two rows pass through
  for (bool inverse : {false, true}) {
    FdReport rep{std::string("moe_sort_chunks") + (inverse ? " inverse" : ""), {}};
    for (uint64_t seed : kSeeds) {
      Rng rng(seed);
      Vec x = rng.vec(N * H), c = rng.vec(N * H), y(N * H);
      auto f = [&] {
        cpu::moe_sort_chunks(y.data(), x.data(), counts.data(), P, L, N, H, inverse);
        return dot(c, y);
      };
      Vec dx(N * H);  // the backward: the same op with inverse flipped
      cpu::moe_sort_chunks(dx.data(), c.data(), counts.data(), P, L, N, H, !inverse);
      rep.add("dx (the op with inverse flipped)", fd_error(x, dx, f));
    }
    rep.print();
  }
}

void fd_merge_visual() {
  const int64_t T = 7, H = 3, Nv = 3;
  const Ints tokens = {5, 1, 1, 7, 0, 1, 9};  // placeholder 1 at t = 1, 2, 5
  for (cpu::MergeMode mode : {cpu::MergeMode::Replace, cpu::MergeMode::Add}) {
    FdReport rep{mode == cpu::MergeMode::Replace ? "merge_visual replace" : "merge_visual add", {}};
    for (uint64_t seed : kSeeds) {
      Rng rng(seed);
      Vec text = rng.vec(T * H), vis = rng.vec(Nv * H), c = rng.vec(T * H), y(T * H);
      auto f = [&] {
        cpu::merge_visual_forward(y.data(), text.data(), vis.data(), tokens.data(), 1, mode, T, Nv, H);
        return dot(c, y);
      };
      Vec dtext(T * H), dvis(Nv * H);
      cpu::merge_visual_backward(dtext.data(), dvis.data(), c.data(), tokens.data(), 1, mode, T, Nv, H);
      rep.add("dtext", fd_error(text, dtext, f));
      rep.add("dvisual", fd_error(vis, dvis, f));
    }
    rep.print();
  }
}

// ---- optimized against ref (float) -----------------------------------------------------------

void ref_linear() {
  struct Case {
    int64_t N, in, out;
    bool bias;
  };
  double fwd = 0, bwd_data = 0, bwd_weight = 0;
  for (const Case& cs : {Case{37, 50, 29, true}, Case{1, 8, 3, false}, Case{128, 128, 384, true},
                         Case{0, 4, 5, true}}) {
    Rng rng(cs.N * 7 + cs.in);
    const int64_t N = cs.N, in = cs.in, out = cs.out;
    VecF x = to_float(rng.vec(N * in)), w = to_float(rng.vec(out * in)), b = to_float(rng.vec(out));
    VecF dy = to_float(rng.vec(N * out));
    const float* bp = cs.bias ? b.data() : nullptr;
    VecF y(N * out), y_ref(N * out);
    cpu::linear_forward(y.data(), x.data(), w.data(), bp, N, in, out);
    cpu::ref::linear_forward(y_ref.data(), x.data(), w.data(), bp, N, in, out);
    track_max(fwd, norm_err(y, y_ref));
    VecF dx(N * in), dx_ref(N * in);
    cpu::linear_backward_data(dx.data(), dy.data(), w.data(), N, in, out);
    cpu::ref::linear_backward_data(dx_ref.data(), dy.data(), w.data(), N, in, out);
    track_max(bwd_data, norm_err(dx, dx_ref));
    VecF dw = to_float(rng.vec(out * in)), db = to_float(rng.vec(out));  // accumulate onto these
    VecF dw_ref = dw, db_ref = db;
    cpu::linear_backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, in, out);
    cpu::ref::linear_backward_weight(dw_ref.data(), db_ref.data(), dy.data(), x.data(), N, in, out);
    track_max(bwd_weight, std::max(norm_err(dw, dw_ref), norm_err(db, db_ref)));
  }
  report("ref/linear forward", fwd, kRefTol);
  report("ref/linear backward_data", bwd_data, kRefTol);
  report("ref/linear backward_weight (accumulating)", bwd_weight, kRefTol);
}

void ref_grouped_linear() {
  struct Case {
    Ints counts;
    int64_t N, in, out;
  };
  double fwd = 0, bwd_data = 0, bwd_weight = 0;
  const std::vector<Case> cases = {
      {{40, 0, 13, 0, 60, 1, 0, 30}, 144, 32, 48},  // experts with no rows
      {{5, 7}, 20, 16, 8},                          // 8 rows past Σ counts (bounded buffer)
      {{0, 0, 0}, 4, 8, 8},                         // no rows at all
  };
  for (const Case& cs : cases) {
    const int64_t E = int64_t(cs.counts.size()), N = cs.N, in = cs.in, out = cs.out;
    Rng rng(N + E);
    VecF x = to_float(rng.vec(N * in)), w = to_float(rng.vec(E * out * in)), dy = to_float(rng.vec(N * out));
    std::vector<const float*> wp;
    for (int64_t e = 0; e < E; e++) wp.push_back(w.data() + e * out * in);
    VecF y(N * out, 7.f), y_ref(N * out, -7.f);  // garbage: the rows past Σ counts must be zeroed
    cpu::grouped_linear_forward(y.data(), x.data(), cs.counts.data(), wp.data(), E, N, in, out);
    cpu::ref::grouped_linear_forward(y_ref.data(), x.data(), cs.counts.data(), wp.data(), E, N, in, out);
    track_max(fwd, norm_err(y, y_ref));
    VecF dx(N * in, 7.f), dx_ref(N * in, -7.f);
    cpu::grouped_linear_backward_data(dx.data(), dy.data(), cs.counts.data(), wp.data(), E, N, in, out);
    cpu::ref::grouped_linear_backward_data(dx_ref.data(), dy.data(), cs.counts.data(), wp.data(), E, N, in, out);
    track_max(bwd_data, norm_err(dx, dx_ref));
    VecF dw = to_float(rng.vec(E * out * in)), dw_ref = dw;
    std::vector<float*> dwp, dwp_ref;
    for (int64_t e = 0; e < E; e++) {
      dwp.push_back(dw.data() + e * out * in);
      dwp_ref.push_back(dw_ref.data() + e * out * in);
    }
    cpu::grouped_linear_backward_weight(dwp.data(), dy.data(), x.data(), cs.counts.data(), E, N, in, out);
    cpu::ref::grouped_linear_backward_weight(dwp_ref.data(), dy.data(), x.data(), cs.counts.data(), E, N, in, out);
    track_max(bwd_weight, norm_err(dw, dw_ref));
  }
  report("ref/grouped_linear forward (empty experts, spare rows)", fwd, kRefTol);
  report("ref/grouped_linear backward_data", bwd_data, kRefTol);
  report("ref/grouped_linear backward_weight (accumulating)", bwd_weight, kRefTol);
}

void ref_attention() {
  const std::vector<AttentionCase> cases = {
      {"causal g=2 pad+1tok", 4, 2, 16, true, {{0, 20}, {1, 1}, {2, 30}, {-1, 13}}},
      {"bidir g=4", 8, 2, 32, false, {{0, 50}, {1, 1}, {2, 70}, {-1, 7}}},
      {"causal g=4 d=128", 4, 1, 128, true, {{3, 100}, {4, 28}}},
      {"causal T=512 g=2", 2, 1, 64, true, {{0, 300}, {1, 200}, {-1, 12}}},
      {"bidir T=512 one segment", 2, 2, 16, false, {{0, 512}}},
      {"all padding", 2, 1, 8, true, {{-1, 9}}},
      {"non-contiguous ids", 4, 2, 8, true, {{0, 5}, {1, 4}, {0, 6}, {-1, 2}}},
      {"windows (bidir, interleaved, padding between)", 4, 4, 16, false,
       {{0, 8}, {1, 8}, {0, 8}, {1, 8}, {-1, 3}, {2, 16}, {3, 8}, {2, 16}, {3, 8}}},
      {"tiny-vlm bench shape", 8, 4, 16, true, {{0, 48}, {1, 40}, {2, 40}}},
  };
  for (const AttentionCase& ac : cases) {
    const Ints seg = segments_of(ac.runs);
    const int64_t T = int64_t(seg.size()), nh = ac.nh, nkv = ac.nkv, d = ac.d;
    const float scale = float(1.0 / std::sqrt(double(d)));
    Rng rng(T * 31 + nh * 7 + d);
    VecF q = to_float(rng.vec(T * nh * d, -2, 2)), k = to_float(rng.vec(T * nkv * d, -2, 2));
    VecF v = to_float(rng.vec(T * nkv * d)), dout = to_float(rng.vec(T * nh * d));
    VecF out(T * nh * d), lse(T * nh), out_ref(T * nh * d), lse_ref(T * nh);
    cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), T, nh, nkv, d,
                           scale, ac.causal);
    cpu::ref::attention_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), seg.data(), T,
                                nh, nkv, d, scale, ac.causal);
    const double fwd = std::max(norm_err(out, out_ref), norm_err(lse, lse_ref));
    VecF dq(q.size()), dk(k.size()), dv(v.size()), dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                            out.data(), lse.data(), seg.data(), T, nh, nkv, d, scale, ac.causal);
    cpu::ref::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(),
                                 v.data(), out_ref.data(), lse_ref.data(), seg.data(), T, nh, nkv, d, scale,
                                 ac.causal);
    const double bwd = std::max({norm_err(dq, dq_ref), norm_err(dk, dk_ref), norm_err(dv, dv_ref)});
    report("ref/attention forward " + ac.name, fwd, kRefTol);
    report("ref/attention backward " + ac.name, bwd, kRefTol);
  }

  // Semantics on the first case: a padding token's and a one-token segment's output is its own v.
  const Ints seg = segments_of({{0, 3}, {1, 1}, {-1, 2}});
  const int64_t T = 6, nh = 4, nkv = 2, d = 4;
  Rng rng(99);
  VecF q = to_float(rng.vec(T * nh * d)), k = to_float(rng.vec(T * nkv * d)), v = to_float(rng.vec(T * nkv * d));
  VecF out(T * nh * d), lse(T * nh);
  cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), T, nh, nkv, d, 0.5f,
                         true);
  double err = 0;
  for (int64_t t : {3, 4, 5})
    for (int64_t h = 0; h < nh; h++)
      for (int64_t c = 0; c < d; c++)
        track_max(err, std::abs(out[(t * nh + h) * d + c] - v[(t * nkv + h / 2) * d + c]));
  report("fwd/attention padding and 1-token segment: out = v", err, 0.0);
}

// ---- forwards of single-implementation kernels against the formula --------------------------

void fwd_norms() {
  const int64_t R = 4, H = 9;
  const double eps = 1e-6;
  Rng rng(5);
  Vec x = rng.vec(R * H, -3, 3), w = rng.vec(H), b = rng.vec(H);
  for (int64_t i = 0; i < H; i++) x[i] += 1000;  // a row with a large mean
  Vec y(R * H), mean(R), rstd(R), y2(R * H), rstd2(R);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, H, eps);
  cpu::rmsnorm_forward(y2.data(), rstd2.data(), x.data(), w.data(), R, H, eps);
  double err_ln = 0, err_rms = 0;
  for (int64_t r = 0; r < R; r++) {
    long double m = 0, var = 0, ms = 0;
    for (int64_t i = 0; i < H; i++) m += x[r * H + i];
    m /= H;
    for (int64_t i = 0; i < H; i++) {
      var += (x[r * H + i] - m) * (x[r * H + i] - m);
      ms += (long double)x[r * H + i] * x[r * H + i];
    }
    var /= H;
    ms /= H;
    for (int64_t i = 0; i < H; i++) {
      const long double ln = (x[r * H + i] - m) / std::sqrt(var + eps) * w[i] + b[i];
      const long double rms = x[r * H + i] / std::sqrt(ms + eps) * w[i];
      track_max(err_ln, double(std::abs(ln - y[r * H + i])));
      track_max(err_rms, double(std::abs(rms - y2[r * H + i])));
    }
  }
  report("fwd/layernorm against the formula", err_ln, kExactTol);
  report("fwd/rmsnorm against the formula", err_rms, kExactTol);
}

void fwd_activations() {
  Rng rng(6);
  const int64_t n = 64;
  Vec x = rng.vec(n, -6, 6), u = rng.vec(n, -3, 3), y(n), s(n), a(n);
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::swiglu_forward(s.data(), x.data(), u.data(), n);
  cpu::add_forward(a.data(), x.data(), u.data(), n);
  double err_gelu = 0, err_swiglu = 0, err_add = 0;
  for (int64_t i = 0; i < n; i++) {
    const long double xi = x[i];
    const long double g = 0.5L * xi * (1 + std::tanh(std::sqrt(2.0L / 3.14159265358979323846L) * (xi + 0.044715L * xi * xi * xi)));
    track_max(err_gelu, double(std::abs(g - y[i])));
    track_max(err_swiglu, double(std::abs(xi / (1 + std::exp(-xi)) * u[i] - s[i])));
    track_max(err_add, std::abs(x[i] + u[i] - a[i]));
  }
  double one = 1, g1 = 0;
  cpu::gelu_forward(&g1, &one, 1);
  track_max(err_gelu, std::abs(g1 - 0.8411919906082768));  // gelu_tanh(1), from torch
  float big = -200.f, sbig = 1.f, ubig = 3.f;
  cpu::swiglu_forward(&sbig, &big, &ubig, 1);  // σ underflows: 0, not NaN
  track_max(err_swiglu, std::abs(double(sbig)));
  report("fwd/gelu (tanh) against the formula", err_gelu, kExactTol);
  report("fwd/swiglu against the formula", err_swiglu, kExactTol);
  report("fwd/add", err_add, 0.0);
}

void fwd_embedding() {
  const int64_t V = 6, H = 4, T = 5;
  Rng rng(7);
  Vec table = rng.vec(V * H), y(T * H);
  const Ints ids = {5, 0, 5, 3, 1};
  cpu::embedding_forward(y.data(), ids.data(), table.data(), T, V, H);
  double err = 0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < H; i++) track_max(err, std::abs(y[t * H + i] - table[ids[t] * H + i]));
  report("fwd/embedding gathers rows", err, 0.0);
}

void fwd_rope() {
  // Against the rotation written out here (long double), with 3 sections of unequal sizes.
  const int64_t T = 5, nh = 3, d = 12, half = 6;
  const Ints secs = {2, 3, 1};
  const double theta = 1e6;
  Rng rng(8);
  const Ints pos = rng.ints(T * 3, 0, 300);
  Vec x = rng.vec(T * nh * d), y(T * nh * d);
  cpu::rope_forward(y.data(), x.data(), pos.data(), secs.data(), 3, T, nh, d, theta);
  double err = 0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < nh; h++)
      for (int64_t j = 0; j < half; j++) {
        const int64_t s = j < 2 ? 0 : j < 5 ? 1 : 2;
        const long double angle = pos[t * 3 + s] * std::pow((long double)theta, -2.0L * j / d);
        const long double a = x[(t * nh + h) * d + j], b = x[(t * nh + h) * d + j + half];
        track_max(err, double(std::abs(a * std::cos(angle) - b * std::sin(angle) - y[(t * nh + h) * d + j])));
        track_max(err, double(std::abs(b * std::cos(angle) + a * std::sin(angle) - y[(t * nh + h) * d + j + half])));
      }
  report("fwd/rope P=3 against the rotation", err, kExactTol);

  // The defining property: q·k after RoPE depends on the positions only through their difference.
  const int64_t dd = 16;
  const Ints one = {8};
  Vec q = rng.vec(dd), k = rng.vec(dd), rq(dd), rk(dd), rq2(dd), rk2(dd);
  const Ints p1 = {7}, p2 = {3}, p1s = {7 + 40}, p2s = {3 + 40};
  cpu::rope_forward(rq.data(), q.data(), p1.data(), one.data(), 1, 1, 1, dd, theta);
  cpu::rope_forward(rk.data(), k.data(), p2.data(), one.data(), 1, 1, 1, dd, theta);
  cpu::rope_forward(rq2.data(), q.data(), p1s.data(), one.data(), 1, 1, 1, dd, theta);
  cpu::rope_forward(rk2.data(), k.data(), p2s.data(), one.data(), 1, 1, 1, dd, theta);
  report("fwd/rope relative: q·k invariant under a shift", std::abs(dot(rq, rk) - dot(rq2, rk2)), 1e-12);
  Vec inplace = x;  // y == x allowed
  cpu::rope_forward(inplace.data(), inplace.data(), pos.data(), secs.data(), 3, T, nh, d, theta);
  report("fwd/rope in place equals out of place", norm_err(inplace, y), 0.0);
}

void fwd_router_topk() {
  // Hand cases: ties go to the lower expert index, order is descending probability.
  const int64_t E = 4, k = 2, T = 4;
  const Vec logits = {1, 1, 1, 1,     // all tied → 0, 1
                      0, 2, 2, 1,     // tie at the top → 1, 2
                      3, 0, 3, 3,     // three tied → 0, 2
                      -1, 5, 0, 4.5}; // no tie → 1, 3
  const Ints want = {0, 1, 1, 2, 0, 2, 1, 3};
  Vec probs(T * E), weights(T * k);
  Ints experts(T * k);
  cpu::router_topk_forward(probs.data(), weights.data(), experts.data(), logits.data(), T, E, k);
  report_bool("fwd/router_topk ties to the lower index", experts == want);
  double err = 0;
  for (int64_t t = 0; t < T; t++) {
    long double m = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; e++) m = std::max<long double>(m, logits[t * E + e]);
    for (int64_t e = 0; e < E; e++) sum += std::exp(logits[t * E + e] - m);
    for (int64_t e = 0; e < E; e++) track_max(err, double(std::abs(std::exp(logits[t * E + e] - m) / sum - probs[t * E + e])));
    const long double p0 = probs[t * E + want[t * k]], p1 = probs[t * E + want[t * k + 1]];
    track_max(err, double(std::abs(p0 / (p0 + p1) - weights[t * k])));
    track_max(err, double(std::abs(p1 / (p0 + p1) - weights[t * k + 1])));
  }
  report("fwd/router_topk probs and renormalized weights", err, kExactTol);

  // Random rows against a stable sort by descending probability (stable = lower index first).
  Rng rng(9);
  const int64_t T2 = 50, E2 = 8, k2 = 3;
  Vec lg(T2 * E2);
  for (double& l : lg) l = rng.integer(0, 4);  // few distinct values: many ties
  Vec p2(T2 * E2), w2(T2 * k2);
  Ints ex2(T2 * k2);
  cpu::router_topk_forward(p2.data(), w2.data(), ex2.data(), lg.data(), T2, E2, k2);
  int64_t mismatches = 0;
  for (int64_t t = 0; t < T2; t++) {
    std::vector<int32_t> order(E2);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lg[t * E2 + a] > lg[t * E2 + b]; });
    for (int64_t j = 0; j < k2; j++) mismatches += order[j] != ex2[t * k2 + j];
  }
  report_bool("fwd/router_topk = stable sort, k=3, many ties", mismatches == 0);
}

void fwd_moe_permute() {
  // Hand case: T = 3, k = 2, E = 4; expert 2 gets no token.
  const int64_t T = 3, k = 2, E = 4, H = 2;
  const Ints experts = {1, 0, 3, 1, 0, 3};  // assignments a = 0 … 5
  const Vec x = {10, 11, 20, 21, 30, 31};
  Vec rows(T * k * H);
  Ints counts(E), row_of(T * k);
  cpu::moe_permute_forward(rows.data(), counts.data(), row_of.data(), x.data(), experts.data(), T, H, k, E,
                           T * k, -1);
  // expert 0: a = 1 (t 0), a = 4 (t 2); expert 1: a = 0 (t 0), a = 3 (t 1); expert 3: a = 2, a = 5
  const Ints want_counts = {2, 2, 0, 2}, want_row_of = {2, 0, 4, 3, 1, 5};
  const Vec want_rows = {10, 11, 30, 31, 10, 11, 20, 21, 20, 21, 30, 31};
  report_bool("fwd/moe_permute hand case (counts, row_of, rows)",
              counts == want_counts && row_of == want_row_of && rows == want_rows);

  // moe_unpermute against the sum written out.
  Rng rng(10);
  const int64_t N = T * k;
  Vec r = rng.vec(N * H), w = rng.vec(T * k, 0, 1), y(T * H);
  cpu::moe_unpermute_forward(y.data(), r.data(), row_of.data(), w.data(), T, k, N, H);
  double err = 0;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < H; i++) {
      double want = 0;
      for (int64_t j = 0; j < k; j++) want += w[t * k + j] * r[row_of[t * k + j] * H + i];
      track_max(err, std::abs(want - y[t * H + i]));
    }
  report("fwd/moe_unpermute weighted sum", err, kExactTol);

  // Capacity 1, the same assignments: each expert keeps its first (a = 1, 0, 2), the rest are
  // dropped; 4 rows, the last past the 3 kept, zero.
  Vec rows1(4 * H, 7.0);
  Ints counts1(E), row_of1(T * k);
  cpu::moe_permute_forward(rows1.data(), counts1.data(), row_of1.data(), x.data(), experts.data(), T, H, k, E, 4,
                           1);
  report_bool("fwd/moe_permute capacity 1 hand case (counts, row_of, rows, zero tail)",
              counts1 == Ints({1, 1, 0, 1}) && row_of1 == Ints({1, 0, 2, -1, -1, -1}) &&
                  rows1 == Vec({10, 11, 10, 11, 20, 21, 0, 0}));
  // ... and moe_unpermute skips the dropped: token 1 and 2 get only their kept choice (t 1: a = 2;
  // t 2: none), unrenormalized
  Vec y1(T * H);
  const Vec w1 = {0.25, 0.75, 0.5, 0.5, 0.4, 0.6};
  cpu::moe_unpermute_forward(y1.data(), rows1.data(), row_of1.data(), w1.data(), T, k, 4, H);
  report_bool("fwd/moe_unpermute dropped assignments add nothing",
              y1 == Vec({0.25 * 10 + 0.75 * 10, 0.25 * 11 + 0.75 * 11, 0.5 * 20, 0.5 * 21, 0, 0}));
}

// Megatron's position drop policy written out plainly: expert by expert, scan the assignments in
// order and keep the first `capacity` that chose it; rows laid out expert by expert.
void moe_permute_reference(Vec& rows, Ints& counts, Ints& row_of, const Vec& x, const Ints& experts, int64_t T,
                           int64_t H, int64_t k, int64_t E, int64_t N, int64_t capacity) {
  rows.assign(N * H, 0.0);
  counts.assign(E, 0);
  row_of.assign(T * k, -1);
  int64_t r = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t a = 0; a < T * k; a++) {
      if (experts[a] != e || counts[e] == capacity) continue;
      counts[e]++;
      row_of[a] = int32_t(r);
      for (int64_t i = 0; i < H; i++) rows[r * H + i] = x[(a / k) * H + i];
      r++;
    }
}

void fwd_moe_permute_capacity() {
  // random routings of T = 16 tokens, top-2 of 6 experts (any distinct pair), capacity 1 … 6
  const int64_t T = 16, H = 3, k = 2, E = 6;
  bool same = true;
  int64_t dropped = 0;
  for (uint64_t seed : kSeeds)
    for (int64_t capacity = 1; capacity <= 6; capacity++) {
      Rng rng(seed * 100 + capacity);
      Ints experts(T * k);
      for (int64_t t = 0; t < T; t++) {
        experts[t * k] = rng.integer(0, E - 1);
        experts[t * k + 1] = (experts[t * k] + rng.integer(1, E - 1)) % E;
      }
      const Vec x = rng.vec(T * H);
      const int64_t N = std::min(T * k, E * capacity);
      Vec rows(N * H), want_rows;
      Ints counts(E), row_of(T * k), want_counts, want_row_of;
      cpu::moe_permute_forward(rows.data(), counts.data(), row_of.data(), x.data(), experts.data(), T, H, k, E, N,
                               capacity);
      moe_permute_reference(want_rows, want_counts, want_row_of, x, experts, T, H, k, E, N, capacity);
      same = same && rows == want_rows && counts == want_counts && row_of == want_row_of;
      dropped += std::count(row_of.begin(), row_of.end(), -1);
    }
  report_bool("fwd/moe_permute capacity = plain reference (random)", same);
  report_bool("fwd/moe_permute capacity drops assignments", dropped > 0);
}

void fwd_moe_aux_loss() {
  // T = 4 (the last is padding), E = 3, k = 1 → n = 3.
  const Vec probs = {0.5, 0.3, 0.2, 0.1, 0.6, 0.3, 0.2, 0.2, 0.6, 0.9, 0.05, 0.05};
  const Ints experts = {0, 1, 2, 0};
  const Ints seg = {0, 0, 1, -1};
  // f = (1/3, 1/3, 1/3), P = (0.8/3, 1.1/3, 1.1/3); loss = coeff·3·Σ f·P = coeff·3·(3.0/9)
  const double coeff = 0.01, want = coeff * 3 * (1.0 / 3) * (0.8 + 1.1 + 1.1) / 3;
  const double got = cpu::moe_aux_loss_forward(probs.data(), experts.data(), seg.data(), 4, 3, 1, coeff);
  const Ints all_pad = {-1, -1, -1, -1};
  const double zero = cpu::moe_aux_loss_forward(probs.data(), experts.data(), all_pad.data(), 4, 3, 1, coeff);
  report("fwd/moe_aux_loss hand case, and 0 when n = 0", std::max(std::abs(got - want), std::abs(zero)), kExactTol);
}

void fwd_cross_entropy() {
  const int64_t T = 5, V = 11;
  Rng rng(11);
  Vec logits = rng.vec(T * V, -5, 5), lse(T);
  for (int64_t v = 0; v < V; v++) logits[3 * V + v] += 1e4;  // stability: huge logits
  const Ints labels = {3, 0, 10, 7, 2};
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 1};
  const double loss_tokens = 6;
  const double got = cpu::cross_entropy_forward(lse.data(), logits.data(), labels.data(), mask.data(), loss_tokens, T, V);
  long double want = 0;
  for (int64_t t = 0; t < T; t++) {
    if (!mask[t]) continue;
    long double m = logits[t * V], sum = 0;
    for (int64_t v = 0; v < V; v++) m = std::max<long double>(m, logits[t * V + v]);
    for (int64_t v = 0; v < V; v++) sum += std::exp((long double)logits[t * V + v] - m);
    want += m + std::log(sum) - logits[t * V + labels[t]];
  }
  want /= loss_tokens;
  report("fwd/cross_entropy against the formula (logits 1e4)", double(std::abs(want - got) / want), kExactTol);
  const Vec two = {1000, 1000};
  const Ints label0 = {0};
  const std::vector<uint8_t> on = {1};
  Vec lse1(1);
  const double ln2 = cpu::cross_entropy_forward(lse1.data(), two.data(), label0.data(), on.data(), 1.0, 1, 2);
  report("fwd/cross_entropy [1000, 1000] = ln 2", std::abs(ln2 - std::log(2.0)), kExactTol);
}

// Every rank's shard lookup, summed over the ranks (the all-reduce), is the whole table's lookup.
void fwd_embedding_shard() {
  const int64_t V = 3, H = 4, T = 6, P = 2;
  Rng rng(17);
  Vec table = rng.vec(P * V * H), whole(T * H), sum(T * H, 0.0);
  const Ints ids = {5, 0, 3, 2, 4, 1};
  cpu::embedding_forward(whole.data(), ids.data(), table.data(), T, P * V, H);
  bool zero_elsewhere = true;
  for (int64_t r = 0; r < P; r++) {
    Vec y(T * H);
    cpu::embedding_shard_forward(y.data(), ids.data(), table.data() + r * V * H, T, V, H, r * V, P * V);
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < H; i++) {
        sum[t * H + i] += y[t * H + i];
        const bool mine = ids[t] >= r * V && ids[t] < (r + 1) * V;
        if (!mine && y[t * H + i] != 0) zero_elsewhere = false;
      }
  }
  report("fwd/embedding vocab shards at ranks 0, 1 sum to the lookup", norm_err(sum, whole), 0.0);
  report_bool("fwd/embedding vocab shard: zero rows for other ranks' ids", zero_elsewhere);
}

// The vocab-parallel composition over P ranks, with the collectives done here by hand:
//   lse = lse_combine(gather_p vocab_logsumexp(logits_p)), target = Σ_p vocab_target_logit_p,
//   loss = ce_from_stats(lse, target, mask)
// equals cross_entropy over the whole vocabulary, value and gradient (P = 1: bit for bit).
void fwd_vocab_parallel_ce() {
  const int64_t T = 6, Vl = 5;
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 0, 1};
  const double loss_tokens = 5, g = 1.3;
  for (int64_t P : {1, 2, 3}) {
    const int64_t V = P * Vl;
    Rng rng(uint64_t(20 + P));
    Vec logits = rng.vec(T * V, -4, 4), lse_ref(T);
    for (int64_t v = 0; v < V; v++) logits[V + v] += 1e4;  // a row of huge logits
    Ints labels = rng.ints(T, 0, int32_t(V - 1));
    labels[2] = -100;  // masked out: never read
    const double want = cpu::cross_entropy_forward(lse_ref.data(), logits.data(), labels.data(), mask.data(),
                                                   loss_tokens, T, V);
    Vec want_d(T * V);
    cpu::cross_entropy_backward(want_d.data(), g, logits.data(), lse_ref.data(), labels.data(), mask.data(),
                                loss_tokens, T, V);
    // forward, rank by rank
    std::vector<Vec> shard(size_t(P), Vec(T * Vl, 0.0));
    std::vector<Vec> lse_p(size_t(P), Vec(T, 0.0));
    Vec gathered(P * T), target(T, 0.0), lse(T);
    for (int64_t r = 0; r < P; r++) {
      for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < Vl; v++) shard[r][t * Vl + v] = logits[t * V + r * Vl + v];
      cpu::vocab_logsumexp_forward(lse_p[r].data(), shard[r].data(), T, Vl);
      std::copy(lse_p[r].begin(), lse_p[r].end(), gathered.begin() + r * T);
      Vec tr(T);
      cpu::vocab_target_logit_forward(tr.data(), shard[r].data(), labels.data(), mask.data(), T, Vl, r * Vl, V);
      for (int64_t t = 0; t < T; t++) target[t] += tr[t];
    }
    cpu::lse_combine_forward(lse.data(), gathered.data(), P, T);
    const double got = cpu::ce_from_stats_forward(lse.data(), target.data(), mask.data(), loss_tokens, T);
    // backward, rank by rank: ce_from_stats → lse_combine (slice of the gather) → vocab_logsumexp,
    // + vocab_target_logit (the all-reduce's gradient is the identity)
    Vec dlse(T), dtarget(T), dgathered(P * T), got_d(T * V);
    cpu::ce_from_stats_backward(dlse.data(), dtarget.data(), g, mask.data(), loss_tokens, T);
    cpu::lse_combine_backward(dgathered.data(), dlse.data(), gathered.data(), lse.data(), P, T);
    for (int64_t r = 0; r < P; r++) {
      Vec d1(T * Vl), d2(T * Vl);
      cpu::vocab_logsumexp_backward(d1.data(), dgathered.data() + r * T, shard[r].data(), lse_p[r].data(), T, Vl);
      cpu::vocab_target_logit_backward(d2.data(), dtarget.data(), labels.data(), mask.data(), T, Vl, r * Vl, V);
      for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < Vl; v++) got_d[t * V + r * Vl + v] = d1[t * Vl + v] + d2[t * Vl + v];
    }
    const std::string at = " (P = " + std::to_string(P) + ")";
    const double tol = P == 1 ? 0.0 : kExactTol;
    report("fwd/vocab-parallel ce = cross_entropy" + at, std::abs(got - want) / std::abs(want), tol);
    report("fwd/vocab-parallel ce gradient = cross_entropy's" + at, norm_err(got_d, want_d), tol);
  }
}

void fwd_moe_ep() {
  const Ints counts = {3, 0, 2, 5, 1, 1};  // E = 6
  Ints ranks(3), ranks2(2);
  cpu::moe_rank_counts(ranks.data(), counts.data(), 6, 3);
  cpu::moe_rank_counts(ranks2.data(), counts.data(), 6, 2);
  report_bool("fwd/moe_rank_counts blocks of E/P", ranks == Ints({3, 7, 2}) && ranks2 == Ints({5, 7}));
  Ints local(3);
  cpu::moe_local_counts(local.data(), counts.data(), 2, 3);  // as [P = 2, L = 3]
  report_bool("fwd/moe_local_counts column sums", local == Ints({8, 1, 3}));

  // P = 2, L = 2, counts [[1, 2], [2, 1]], N = 7 (one row past Σ), H = 1. p-major blocks:
  // (0,0) = [1], (0,1) = [21, 22], (1,0) = [31, 32], (1,1) = [4]; l-major: (0,0) (1,0) (0,1) (1,1)
  const Ints c = {1, 2, 2, 1};
  const Vec x = {1, 21, 22, 31, 32, 4, 99};
  Vec y(7), back(7);
  cpu::moe_sort_chunks(y.data(), x.data(), c.data(), 2, 2, 7, 1, false);
  cpu::moe_sort_chunks(back.data(), y.data(), c.data(), 2, 2, 7, 1, true);
  report_bool("fwd/moe_sort_chunks hand case, and inverse undoes it",
              y == Vec({1, 31, 32, 21, 22, 4, 99}) && back == x);
}

// group_slice keeps block r of dim 0 (ranks 0 and 1 of 2)
void fwd_group_slice() {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};  // [2·1, 3]
  std::vector<float> y0(3), y1(3);
  lfc::basic::take_block(y0.data(), x.data(), 3 * sizeof(float), 0);
  lfc::basic::take_block(y1.data(), x.data(), 3 * sizeof(float), 1);
  report_bool("fwd/group_slice block of rank 0 and rank 1 of 2",
              y0 == std::vector<float>({1, 2, 3}) && y1 == std::vector<float>({4, 5, 6}));
}

void fwd_merge_visual() {
  const int64_t T = 5, H = 2;
  const Ints tokens = {4, 1, 6, 1, 0};
  const Vec text = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, vis = {100, 200, 300, 400};
  Vec y(T * H);
  cpu::merge_visual_forward(y.data(), text.data(), vis.data(), tokens.data(), 1, cpu::MergeMode::Replace, T, 2, H);
  const bool replace_ok = y == Vec{1, 2, 100, 200, 5, 6, 300, 400, 9, 10};
  cpu::merge_visual_forward(y.data(), text.data(), vis.data(), tokens.data(), 1, cpu::MergeMode::Add, T, 2, H);
  const bool add_ok = y == Vec{1, 2, 103, 204, 5, 6, 307, 408, 9, 10};
  report_bool("fwd/merge_visual hand case, replace and add", replace_ok && add_ok);

  const Ints no_image = {4, 5, 6, 7, 0};  // Nv = 0: the text passes through
  Vec dtext(T * H), dvis;
  cpu::merge_visual_forward(y.data(), text.data(), vis.data(), no_image.data(), 1, cpu::MergeMode::Replace, T, 0, H);
  cpu::merge_visual_backward(dtext.data(), dvis.data(), text.data(), no_image.data(), 1, cpu::MergeMode::Replace, T, 0, H);
  report_bool("fwd/merge_visual Nv = 0 passes the text through", y == text && dtext == text);
}

void fwd_optimizer() {
  // AdamW, 3 steps, against the formula of tiny-vlm.md evaluated here.
  const int64_t n = 6;
  Rng rng(12);
  const cpu::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1};
  Vec p = rng.vec(n), m(n, 0.0), v(n, 0.0);
  Vec hp_p = p, hp_m = m, hp_v = v;  // by hand
  VecF pf = to_float(p), mf(n, 0.f), vf(n, 0.f);
  double err = 0, err_f = 0;
  for (int64_t t = 1; t <= 3; t++) {
    const Vec g = rng.vec(n, -2, 2);
    const VecF gf = to_float(g);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, hp, t);
    cpu::adamw_step(pf.data(), gf.data(), mf.data(), vf.data(), n, hp, t);
    for (int64_t i = 0; i < n; i++) {
      hp_p[i] -= hp.lr * hp.weight_decay * hp_p[i];
      hp_m[i] = hp.beta1 * hp_m[i] + (1 - hp.beta1) * g[i];
      hp_v[i] = hp.beta2 * hp_v[i] + (1 - hp.beta2) * g[i] * g[i];
      const double mhat = hp_m[i] / (1 - std::pow(hp.beta1, t)), vhat = hp_v[i] / (1 - std::pow(hp.beta2, t));
      hp_p[i] -= hp.lr * mhat / (std::sqrt(vhat) + hp.eps);
    }
    track_max(err, std::max({norm_err(p, hp_p), norm_err(m, hp_m), norm_err(v, hp_v)}));
    track_max(err_f, std::max({norm_err(pf, hp_p), norm_err(mf, hp_m), norm_err(vf, hp_v)}));
  }
  report("fwd/adamw 3 steps by hand (double)", err, kExactTol);
  report("fwd/adamw 3 steps by hand (float)", err_f, 1e-6);

  const Vec x = {3, -4, 12};
  Vec y = x;
  cpu::scale(y.data(), 0.5, 3);
  const double ss = cpu::sum_squares(x.data(), 3);
  report("fwd/sum_squares and scale", std::abs(ss - 169) + norm_err(y, Vec{1.5, -2, 6}), 0.0);
}

// ---- bad arguments throw KernelError ------------------------------------------------------------

void err_checks() {
  Vec buf(64, 0.0);
  const Ints bad_ids = {0, 9};
  report_bool("err/embedding id out of range", throws_kernel_error([&] {
    cpu::embedding_forward(buf.data(), bad_ids.data(), buf.data(), 2, 4, 2);
  }, "embedding_forward: ids[1] = 9"));
  const Ints too_many = {3, 4};
  std::vector<const double*> w = {buf.data(), buf.data()};
  report_bool("err/grouped_linear counts exceed rows", throws_kernel_error([&] {
    cpu::grouped_linear_forward(buf.data(), buf.data(), too_many.data(), w.data(), 2, 6, 2, 2);
  }, "counts sum to 7 rows but x has 6"));
  const Ints tokens = {1, 0, 1};
  report_bool("err/merge_visual placeholder count != Nv", throws_kernel_error([&] {
    cpu::merge_visual_forward(buf.data(), buf.data(), buf.data(), tokens.data(), 1, cpu::MergeMode::Replace, 3, 3, 2);
  }, "merge_visual_forward: 2 placeholder tokens (id 1) in the text but 3 visual rows"));
  const Ints labels = {0};
  const std::vector<uint8_t> mask = {1};
  report_bool("err/cross_entropy loss_tokens = 0", throws_kernel_error([&] {
    cpu::cross_entropy_forward(buf.data(), buf.data(), labels.data(), mask.data(), 0.0, 1, 4);
  }, "no loss token"));
  report_bool("err/embedding vocab shard id outside the vocabulary", throws_kernel_error([&] {
    cpu::embedding_shard_forward(buf.data(), bad_ids.data(), buf.data(), 2, 2, 2, 2, 4);
  }, "embedding_shard_forward: ids[1] = 9 is outside the vocabulary of 4"));
  const Ints big_label = {8};
  report_bool("err/vocab_target_logit masked-in label outside the vocabulary", throws_kernel_error([&] {
    cpu::vocab_target_logit_forward(buf.data(), buf.data(), big_label.data(), mask.data(), 1, 4, 4, 8);
  }, "labels[0] = 8 is outside the vocab of 8"));
  report_bool("err/ce_from_stats loss_tokens = 0", throws_kernel_error([&] {
    cpu::ce_from_stats_forward(buf.data(), buf.data(), mask.data(), 0.0, 1);
  }, "ce_from_stats_forward: loss_tokens is 0"));
  const Ints sort_counts = {2, 3};
  report_bool("err/moe_sort_chunks counts exceed rows", throws_kernel_error([&] {
    cpu::moe_sort_chunks(buf.data(), buf.data() + 32, sort_counts.data(), 2, 1, 4, 2, false);
  }, "counts sum to 5 rows but there are 4"));
  Ints rc(4);
  report_bool("err/moe_rank_counts experts not a multiple of ranks", throws_kernel_error([&] {
    cpu::moe_rank_counts(rc.data(), sort_counts.data(), 2, 4);
  }, "2 experts are not a multiple of 4 ranks"));
  const Ints seg = {0, 0};
  report_bool("err/attention nh not a multiple of nkv", throws_kernel_error([&] {
    cpu::attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), seg.data(), 2, 3, 2, 2, 1.0, true);
  }, "query heads 3 are not a multiple of KV heads 2"));
  const Ints experts = {0, 5};
  Ints counts(4), row_of(2);
  report_bool("err/moe_permute expert out of range", throws_kernel_error([&] {
    cpu::moe_permute_forward(buf.data(), counts.data(), row_of.data(), buf.data(), experts.data(), 1, 2, 2, 4, 2,
                             -1);
  }, "expert 5"));
  const Ints two_experts = {0, 1};
  report_bool("err/moe_permute kept rows past the buffer", throws_kernel_error([&] {
    cpu::moe_permute_forward(buf.data(), counts.data(), row_of.data(), buf.data(), two_experts.data(), 1, 2, 2, 4,
                             1, 1);
  }, "2 kept rows do not fit the 1 rows"));
  const Ints bad_row = {0, -2};
  report_bool("err/moe_unpermute row_of below −1", throws_kernel_error([&] {
    cpu::moe_unpermute_forward(buf.data(), buf.data(), bad_row.data(), buf.data(), 1, 2, 2, 2);
  }, "row_of[1] = -2"));
  const Ints secs = {3, 2};
  const Ints pos = {0, 0};
  report_bool("err/rope sections do not sum to d/2", throws_kernel_error([&] {
    cpu::rope_forward(buf.data(), buf.data(), pos.data(), secs.data(), 2, 1, 1, 8, 1e4);
  }, "sections sum to 5, head dim/2 is 4"));
  report_bool("err/adamw step 0", throws_kernel_error([&] {
    Vec p(1), g(1), m(1), v(1);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), 1, cpu::AdamWParams{1e-3}, 0);
  }, "step 0"));
}

// ---- --bench: median time, optimized against ref ------------------------------------------------

int bench() {
  std::printf("float32, median of 21 runs\n");
  {  // tiny-vlm dense gate_proj: (T, Hd) · (F, Hd)ᵀ
    const int64_t N = 128, in = 128, out = 384;
    Rng rng(1);
    VecF x = to_float(rng.vec(N * in)), w = to_float(rng.vec(out * in)), dy = to_float(rng.vec(N * out));
    VecF y(N * out), dx(N * in), dw(out * in), db(out);
    bench_line("linear forward N=128 in=128 out=384",
               median_ms([&] { cpu::linear_forward<float>(y.data(), x.data(), w.data(), nullptr, N, in, out); }),
               median_ms([&] { cpu::ref::linear_forward<float>(y.data(), x.data(), w.data(), nullptr, N, in, out); }));
    bench_line("linear backward (data + weight)",
               median_ms([&] {
                 cpu::linear_backward_data(dx.data(), dy.data(), w.data(), N, in, out);
                 cpu::linear_backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, in, out);
               }),
               median_ms([&] {
                 cpu::ref::linear_backward_data(dx.data(), dy.data(), w.data(), N, in, out);
                 cpu::ref::linear_backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, in, out);
               }));
  }
  {  // attention at tiny-vlm's decoder shape
    const Ints seg = segments_of({{0, 48}, {1, 40}, {2, 40}});
    const int64_t T = 128, nh = 8, nkv = 4, d = 16;
    const float scale = 0.25f;
    Rng rng(2);
    VecF q = to_float(rng.vec(T * nh * d)), k = to_float(rng.vec(T * nkv * d)), v = to_float(rng.vec(T * nkv * d));
    VecF dout = to_float(rng.vec(T * nh * d)), out(T * nh * d), lse(T * nh);
    VecF dq(q.size()), dk(k.size()), dv(v.size());
    auto fwd = [&](auto f) {
      return median_ms([&] { f(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), T, nh, nkv, d, scale, true); });
    };
    bench_line("attention forward T=128 nh=8 nkv=4 d=16 causal 3 segments",
               fwd(cpu::attention_forward<float>), fwd(cpu::ref::attention_forward<float>));
    cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), T, nh, nkv, d, scale, true);
    auto bwd = [&](auto f) {
      return median_ms([&] {
        f(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
          seg.data(), T, nh, nkv, d, scale, true);
      });
    };
    bench_line("attention backward", bwd(cpu::attention_backward<float>), bwd(cpu::ref::attention_backward<float>));
  }
  {  // tiny-vlm-moe expert gate_proj: T=128, k=2 → N=256 rows, H=128 → F=128, E=8
    const int64_t E = 8, N = 256, in = 128, out = 128;
    const Ints counts = {40, 25, 38, 31, 0, 52, 30, 40};  // Σ = 256, one idle expert
    Rng rng(3);
    VecF x = to_float(rng.vec(N * in)), w = to_float(rng.vec(E * out * in)), dy = to_float(rng.vec(N * out));
    VecF y(N * out), dx(N * in), dw(E * out * in);
    std::vector<const float*> wp;
    std::vector<float*> dwp;
    for (int64_t e = 0; e < E; e++) {
      wp.push_back(w.data() + e * out * in);
      dwp.push_back(dw.data() + e * out * in);
    }
    bench_line("grouped_linear forward N=256 in=128 out=128 E=8",
               median_ms([&] { cpu::grouped_linear_forward(y.data(), x.data(), counts.data(), wp.data(), E, N, in, out); }),
               median_ms([&] { cpu::ref::grouped_linear_forward(y.data(), x.data(), counts.data(), wp.data(), E, N, in, out); }));
    bench_line("grouped_linear backward (data + weight)",
               median_ms([&] {
                 cpu::grouped_linear_backward_data(dx.data(), dy.data(), counts.data(), wp.data(), E, N, in, out);
                 cpu::grouped_linear_backward_weight(dwp.data(), dy.data(), x.data(), counts.data(), E, N, in, out);
               }),
               median_ms([&] {
                 cpu::ref::grouped_linear_backward_data(dx.data(), dy.data(), counts.data(), wp.data(), E, N, in, out);
                 cpu::ref::grouped_linear_backward_weight(dwp.data(), dy.data(), x.data(), counts.data(), E, N, in, out);
               }));
  }
  pool_bench();
  return 0;
}

// ---- ViT data-parallel balance ----------------------------------------------------------------

void fwd_image_sizes() {
  const Ints seg = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  Ints sizes(3);
  cpu::image_sizes(sizes.data(), seg.data(), 12, 3);
  report_bool("fwd/image_sizes patches per image, zero past the last", sizes == Ints({4, 8, 0}));
  Ints y(4);
  const Ints s2 = {-1, 0, 3, 9};
  cpu::segment_offset(y.data(), s2.data(), 4, 2, 10);
  report_bool("fwd/segment_offset + rank·stride, padding kept", y == Ints({-1, 20, 23, 29}));
}

// Hand-worked cases of DESIGN.md's rule: cost = patches², cost descending then global index,
// least total cost so far, ties to the lower rank.
void fwd_balance_rule() {
  // rank 0: images of 8, 4, 4 patches; rank 1: one of 4. Costs 64 | 16 16 | 16: the 64 to rank 0,
  // then every 16 to rank 1 (16 < 64, 32 < 64, 48 < 64): rank 0's images 1 and 2 move
  {
    const Ints all = {8, 4, 4, 4, 0, 0};
    Ints dest(6);
    const int64_t moved = cpu::balance_assign(dest.data(), all.data(), 2, 3, 64);
    report_bool("fwd/balance_assign largest first, least loaded, ties low",
                dest == Ints({0, 1, 1, 1, -1, -1}) && moved == 2);
  }
  // rank 0: 4 and 8 patches; rank 1: 4. Sorted 64 (0,1), 16 (0,0), 16 (1,0): (0,1) → 0,
  // (0,0) → 1, (1,0) → 1. Rank 0 sends image 1 to itself first, then image 0 to rank 1; its
  // tokens come back in that order: image 1's two, then image 0's one.
  {
    const Ints all = {4, 8, 4, 0};
    const Ints seg0 = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, seg1 = {0, 0, 0, 0};
    Ints send0(2), order0(12), back0(2), inv0(3), send1(2), order1(4), back1(2), inv1(1);
    const int64_t m0 = cpu::vit_balance_route(send0.data(), order0.data(), back0.data(), inv0.data(), all.data(),
                                              seg0.data(), 12, 2, 2, 0, 4, 64);
    const int64_t m1 = cpu::vit_balance_route(send1.data(), order1.data(), back1.data(), inv1.data(), all.data(),
                                              seg1.data(), 4, 2, 2, 1, 4, 64);
    report_bool("fwd/vit_balance_route rank 0: send, order, back, inverse",
                send0 == Ints({8, 4}) && order0 == Ints({4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3}) &&
                    back0 == Ints({2, 0}) && inv0 == Ints({2, 0, 1}) && m0 == 1);
    report_bool("fwd/vit_balance_route rank 1: receives rank 0's image 0 and its own",
                send1 == Ints({0, 4}) && order1 == Ints({0, 1, 2, 3}) && back1 == Ints({1, 1}) &&
                    inv1 == Ints({0}) && m1 == 1);
  }
  // an image larger than every rank's room: nothing moves
  {
    const Ints all = {8, 4};
    Ints dest(2);
    const int64_t moved = cpu::balance_assign(dest.data(), all.data(), 2, 1, 6);
    report_bool("fwd/balance_assign no room anywhere: every image stays home", dest == Ints({0, 1}) && moved == 0);
  }
}

// Random groups: every rank routes its own patches, the exchange is simulated both ways. Each
// rank must receive whole images within capacity, give back what it received, and get every own
// visual token back in place; with room to spare the greedy keeps loads within one image's cost.
void fwd_balance_exchange() {
  const int64_t I = 5, merge = 4;
  bool whole = true, roundTrip = true, agree = true, within = true, counts = true;
  int groups = 0;
  for (uint64_t seed = 1; seed <= 40; seed++) {
    Rng rng(seed);
    const int64_t P = 2 + seed % 4, capacity = I * 16;
    Ints all(size_t(P * I), 0);
    std::vector<Ints> segs(static_cast<size_t>(P));
    for (int64_t p = 0; p < P; p++) {
      const int n = rng.integer(0, int32_t(I));
      for (int i = 0; i < n; i++) {
        all[size_t(p * I + i)] = merge * rng.integer(1, 4);
        for (int k = 0; k < all[size_t(p * I + i)]; k++) segs[size_t(p)].push_back(i);
      }
    }
    struct Route { Ints send, order, back, inverse; int64_t moved; };
    std::vector<Route> r(static_cast<size_t>(P));
    for (int64_t p = 0; p < P; p++) {
      const int64_t N = int64_t(segs[size_t(p)].size());
      Route& x = r[size_t(p)];
      x.send.resize(size_t(P)), x.order.resize(size_t(N)), x.back.resize(size_t(P)), x.inverse.resize(size_t(N / merge));
      x.moved = cpu::vit_balance_route(x.send.data(), x.order.data(), x.back.data(), x.inverse.data(), all.data(),
                                       segs[size_t(p)].data(), N, P, I, p, merge, capacity);
      agree = agree && x.moved == r[0].moved;
    }
    // forward: rank q receives, from each p in turn, p's block for q (rows labelled (p, row))
    std::vector<std::vector<std::pair<int64_t, int64_t>>> got(static_cast<size_t>(P));
    for (int64_t p = 0; p < P; p++) {
      int64_t at = 0;
      for (int64_t q = 0; q < P; q++)
        for (int32_t k = 0; k < r[size_t(p)].send[size_t(q)]; k++, at++)
          got[size_t(q)].push_back({p, r[size_t(p)].order[size_t(at)]});
    }
    std::vector<int64_t> load(static_cast<size_t>(P), 0);
    int64_t biggest = 0;
    for (int64_t q = 0; q < P; q++) {
      const auto& g = got[size_t(q)];
      whole = whole && int64_t(g.size()) <= capacity;
      for (size_t k = 0; k < g.size();) {  // whole images, each contiguous, from its first patch
        const auto [p, row] = g[k];
        const int32_t img = segs[size_t(p)][size_t(row)];
        const int32_t n = all[size_t(p * I + img)];
        for (int32_t j = 0; j < n; j++)
          whole = whole && k + j < g.size() && g[k + j].first == p && g[k + j].second == row + j &&
                  segs[size_t(p)][size_t(row + j)] == img && (j > 0 || row == 0 || segs[size_t(p)][size_t(row - 1)] != img);
        load[size_t(q)] += int64_t(n) * n;
        biggest = std::max<int64_t>(biggest, int64_t(n) * n);
        k += size_t(std::max(n, 1));
      }
      for (int64_t p = 0; p < P; p++) counts = counts && r[size_t(q)].back[size_t(p)] * merge == r[size_t(p)].send[size_t(q)];
    }
    // back: each q returns one token per merge rows received to its source; rank p gets the
    // blocks of q = 0, 1, … in turn
    for (int64_t p = 0; p < P; p++) {
      std::vector<int64_t> arrived;
      for (int64_t q = 0; q < P; q++)
        for (size_t k = 0; k < got[size_t(q)].size(); k += size_t(merge))
          if (got[size_t(q)][k].first == p) arrived.push_back(got[size_t(q)][k].second / merge);
      const Ints& inv = r[size_t(p)].inverse;
      for (size_t u = 0; u < inv.size(); u++)
        roundTrip = roundTrip && inv[u] >= 0 && size_t(inv[u]) < arrived.size() && arrived[size_t(inv[u])] == int64_t(u);
      roundTrip = roundTrip && arrived.size() == inv.size();
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    within = within && *hi - *lo <= biggest;
    groups++;
  }
  report_bool("fwd/vit_balance_route 40 random groups: whole images within capacity", whole);
  report_bool("fwd/vit_balance_route: back = received rows / merge, moved alike on every rank", counts && agree);
  report_bool("fwd/vit_balance_route: every own token comes back to its place", roundTrip);
  report_bool("fwd/balance_assign: loads within one image's cost of each other", within && groups == 40);
}

// gather_rows is linear; scatter_rows is its adjoint: <gather(x), dy> = <x, scatter(dy)> (an exact
// finite-difference check of a linear map: the derivative is the map)
void fd_gather_rows() {
  double worst = 0;
  for (uint64_t seed : kSeeds) {
    Rng rng(seed);
    const int64_t N = 7, M = 9, H = 3;
    const Vec x = rng.vec(size_t(N * H)), dy = rng.vec(size_t(M * H));
    const Ints index = rng.ints(size_t(M), 0, int32_t(N - 1));  // repeats: their gradients sum
    Vec y(size_t(M * H)), dx(size_t(N * H), 99.0);
    cpu::gather_rows(reinterpret_cast<std::byte*>(y.data()), reinterpret_cast<const std::byte*>(x.data()),
                     index.data(), M, N, H * int64_t(sizeof(double)));
    cpu::scatter_rows(dx.data(), dy.data(), index.data(), M, N, H);
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t i = 0; i < M * H; i++) lhs += y[size_t(i)] * dy[size_t(i)], scale += std::abs(y[size_t(i)] * dy[size_t(i)]);
    for (int64_t i = 0; i < N * H; i++) rhs += x[size_t(i)] * dx[size_t(i)];
    bool picked = true;
    for (int64_t i = 0; i < M; i++)
      for (int64_t h = 0; h < H; h++) picked = picked && y[size_t(i * H + h)] == x[size_t(index[size_t(i)] * H + h)];
    track_max(worst, picked ? std::abs(lhs - rhs) / scale : 1.0);
  }
  report("fd/gather_rows and scatter_rows (adjoint, exact)", worst, kExactTol);
}

void err_balance() {
  Ints out(8);
  const Ints gap = {0, 0, 2, 2};
  report_bool("err/image_sizes images out of order", throws_kernel_error([&] {
    cpu::image_sizes(out.data(), gap.data(), 4, 3);
  }, "image_sizes: patch 2 has image index 2 after 0"));
  const Ints all = {8, 0}, seg = {0, 0, 0, 0};
  Ints a(1), b(4), c(1), d(1);
  report_bool("err/vit_balance_route sizes disagree with the segments", throws_kernel_error([&] {
    cpu::vit_balance_route(a.data(), b.data(), c.data(), d.data(), all.data(), seg.data(), 4, 1, 2, 0, 4, 64);
  }, "the sizes of rank 0 add up to 8 patches, its segments have 4"));
  const Ints idx = {0, 5};
  Vec x(4), y(4);
  report_bool("err/gather_rows index out of range", throws_kernel_error([&] {
    cpu::gather_rows(reinterpret_cast<std::byte*>(y.data()), reinterpret_cast<const std::byte*>(x.data()), idx.data(),
                     2, 2, 2 * int64_t(sizeof(double)));
  }, "gather_rows: index 5 at 1 outside [0, 2)"));
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) return bench();
  if (argc > 1) {
    std::fprintf(stderr, "usage: kernel_check [--bench]\n");
    return 2;
  }
  // the kernels OpenBLAS runs: the test that starts this checks they are lfc's choice
  std::printf("OpenBLAS core: %s\n", openblas_get_corename());
  const auto t0 = std::chrono::steady_clock::now();
  fd_linear();
  fd_grouped_linear();
  fd_norms();
  fd_embedding();
  fd_activations();
  fd_rope();
  fd_attention();
  fd_router_topk();
  fd_moe_permute(-1);
  fd_moe_permute(2);
  fd_moe_aux_loss();
  fd_cross_entropy();
  fd_embedding_shard();
  fd_vocab_parallel();
  fd_moe_sort_chunks();
  fd_merge_visual();
  fd_gather_rows();
  ref_linear();
  ref_grouped_linear();
  ref_attention();
  fwd_norms();
  fwd_activations();
  fwd_embedding();
  fwd_rope();
  fwd_router_topk();
  fwd_moe_permute();
  fwd_moe_permute_capacity();
  fwd_moe_aux_loss();
  fwd_cross_entropy();
  fwd_embedding_shard();
  fwd_vocab_parallel_ce();
  fwd_moe_ep();
  fwd_group_slice();
  fwd_merge_visual();
  fwd_optimizer();
  fwd_image_sizes();
  fwd_balance_rule();
  fwd_balance_exchange();
  pool_checks();
  bf16_checks();
  sum_checks();
  err_checks();
  err_balance();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d checks, %d failed, %.1f s\n", g_checks, g_failures, secs);
  return g_failures ? 1 : 0;
}
