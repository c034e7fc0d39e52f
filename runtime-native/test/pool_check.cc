// The pool/ tier of kernel_check: the kernel thread pool (core/thread_pool.h) itself, and every
// pooled kernel against its one-thread lfc::cpu::ref loop (error = max|pooled − ref| / max|ref|;
// 0 where the kernel promises ref's bits) and against itself at 1, 2 and 3 threads, byte for byte
// (the determinism rule: blocks and the order of partial sums never depend on the thread count).
// Sizes span several blocks (kElementGrain elements, row_grain rows) with a ragged last one.

#include <atomic>
#include <stdexcept>

#include "check.h"
#include "core/thread_pool.h"

namespace {

constexpr int kThreadCounts[] = {1, 2, 3};
const int64_t kElems = 9 * cpu::kElementGrain + 123;  // 10 blocks (sum_squares: 3), the last one short

using Bytes = std::vector<unsigned char>;
inline size_t sz(int64_t n) { return size_t(n); }

template <typename T>
void append_bytes(Bytes& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

// run() computes the pooled kernel on fresh copies of its inputs and returns its outputs as bytes;
// whether they are the same at every thread count of kThreadCounts
template <typename Run>
bool same_bits_at_thread_counts(Run&& run) {
  const int before = lfc::kernelThreads();
  std::vector<Bytes> outs;
  for (int n : kThreadCounts) {
    lfc::setKernelThreads(n);
    outs.push_back(run());
  }
  lfc::setKernelThreads(before);
  for (const Bytes& o : outs)
    if (o != outs[0]) return false;
  return true;
}

// what: the outputs compared with ref ("" for all of them)
void report_pooled(const std::string& kernel, double err_vs_ref, double tol, bool same_bits,
                   const std::string& what = "") {
  report("pool/" + kernel + (what.empty() ? "" : " " + what) + " vs ref", err_vs_ref, tol);
  report_bool("pool/" + kernel + " same bytes at 1, 2, 3 threads", same_bits);
}

// ---- the pool ----------------------------------------------------------------------------------

void pool_itself() {
  lfc::ThreadPool pool(3);
  // every block once, with the boundaries k·grain
  const int64_t n = 1000, grain = 7;
  std::vector<std::atomic<int>> hits(n);
  std::atomic<bool> aligned{true};
  pool.parallelFor(n, grain, [&](int64_t b, int64_t e) {
    if (b % grain != 0 || e != std::min(n, b + grain)) aligned = false;
    for (int64_t i = b; i < e; i++) hits[size_t(i)]++;
  });
  bool once = true;
  for (auto& h : hits) once = once && h == 1;
  report_bool("pool/parallelFor runs each block once, at k·grain", once && aligned);

  // a parallelFor inside a block runs inline (no deadlock), in block order
  std::vector<int64_t> inner_sum(sz((n + grain - 1) / grain), 0);
  pool.parallelFor(n, grain, [&](int64_t b, int64_t) {
    std::vector<int64_t> order;
    pool.parallelFor(5, 1, [&](int64_t i, int64_t) { order.push_back(i); });
    inner_sum[size_t(b / grain)] = order == std::vector<int64_t>{0, 1, 2, 3, 4};
  });
  bool nested = true;
  for (int64_t s : inner_sum) nested = nested && s == 1;
  report_bool("pool/nested parallelFor runs inline, in order", nested);

  // a block's exception reaches the caller, and the pool runs the next job
  const bool thrown = [&] {
    try {
      pool.parallelFor(100, 1, [&](int64_t b, int64_t) {
        if (b == 57) throw std::runtime_error("block 57");
      });
    } catch (const std::runtime_error& e) {
      return std::string(e.what()) == "block 57";
    }
    return false;
  }();
  std::atomic<int64_t> after{0};
  pool.parallelFor(100, 1, [&](int64_t, int64_t) { after++; });
  report_bool("pool/a block's exception is rethrown, the pool goes on", thrown && after == 100);

  pool.resize(1);
  int64_t serial = 0;
  pool.parallelFor(10, 3, [&](int64_t b, int64_t e) { serial += e - b; });
  report_bool("pool/resize to 1 thread runs inline", pool.threads() == 1 && serial == 10);
}

// ---- optimizer ---------------------------------------------------------------------------------

void pool_optimizer() {
  Rng rng(101);
  const VecF x = to_float(rng.vec(sz(kElems), -3, 3)), g = to_float(rng.vec(sz(kElems), -2, 2));
  {
    const double r = cpu::ref::sum_squares(x.data(), kElems), p = cpu::sum_squares(x.data(), kElems);
    const bool same = same_bits_at_thread_counts([&] {
      const double s = cpu::sum_squares(x.data(), kElems);
      Bytes b(sizeof s);
      std::memcpy(b.data(), &s, sizeof s);
      return b;
    });
    // ref's one running sum over n terms is within n·2⁻⁵³ (≈ 5e-12 here) of the exact sum
    report_pooled("sum_squares", std::abs(p - r) / r, 1e-11, same);
  }
  {
    VecF acc_ref = x, acc = x;
    cpu::ref::grad_accumulate(acc_ref.data(), g.data(), kElems);
    cpu::grad_accumulate(acc.data(), g.data(), kElems);
    const bool same = same_bits_at_thread_counts([&] {
      VecF a = x;
      cpu::grad_accumulate(a.data(), g.data(), kElems);
      Bytes b;
      append_bytes(b, a);
      return b;
    });
    report_pooled("grad_accumulate", norm_err(acc, acc_ref), 0.0, same);
  }
  {
    const cpu::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 0.7};
    const VecF m0 = to_float(rng.vec(sz(kElems), -0.1, 0.1)), v0 = to_float(rng.vec(sz(kElems), 0, 0.01));
    const auto step = [&](bool pooled) {
      VecF p = x, m = m0, v = v0;
      if (pooled) cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), kElems, hp, 3);
      else cpu::ref::adamw_step(p.data(), g.data(), m.data(), v.data(), kElems, hp, 3);
      Bytes b;
      append_bytes(b, p);
      append_bytes(b, m);
      append_bytes(b, v);
      return b;
    };
    report_pooled("adamw_step", step(true) == step(false) ? 0.0 : 1.0, 0.0,
                  same_bits_at_thread_counts([&] { return step(true); }));
  }
}

// ---- activations -------------------------------------------------------------------------------

// an elementwise kernel, kernel(pooled, outputs) filling outputs (each kElems), against ref: error =
// max |pooled − ref| / max |ref| over each output, within tol (0: ref's bits)
template <typename Kernel>
void pool_elementwise(const std::string& name, int outputs, Kernel&& kernel, double tol = 0) {
  const auto run = [&](bool pooled) {
    std::vector<VecF> outs(sz(outputs), VecF(sz(kElems)));
    kernel(pooled, outs);
    return outs;
  };
  const std::vector<VecF> fast = run(true), plain = run(false);
  double err = 0;
  for (size_t o = 0; o < fast.size(); o++) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < fast[o].size(); i++) {
      diff = std::max(diff, std::fabs(double(fast[o][i]) - double(plain[o][i])));
      scale = std::max(scale, std::fabs(double(plain[o][i])));
    }
    err = std::max(err, scale > 0 ? diff / scale : diff);
  }
  report_pooled(name, err, tol, same_bits_at_thread_counts([&] {
                  Bytes b;
                  for (const VecF& o : run(true)) append_bytes(b, o);
                  return b;
                }));
}

void pool_activations() {
  Rng rng(102);
  const VecF x = to_float(rng.vec(sz(kElems), -4, 4)), u = to_float(rng.vec(sz(kElems), -2, 2)),
             dy = to_float(rng.vec(sz(kElems)));
  const int64_t n = kElems;
  pool_elementwise("gelu_forward", 1, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::gelu_forward(o[0].data(), x.data(), n) : cpu::ref::gelu_forward(o[0].data(), x.data(), n);
  }, 1e-6);
  pool_elementwise("gelu_backward", 1, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::gelu_backward(o[0].data(), dy.data(), x.data(), n)
      : cpu::ref::gelu_backward(o[0].data(), dy.data(), x.data(), n);
  }, 1e-6);
  pool_elementwise("gelu_exact_forward", 1, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::gelu_exact_forward(o[0].data(), x.data(), n) : cpu::ref::gelu_exact_forward(o[0].data(), x.data(), n);
  });
  pool_elementwise("gelu_exact_backward", 1, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::gelu_exact_backward(o[0].data(), dy.data(), x.data(), n)
      : cpu::ref::gelu_exact_backward(o[0].data(), dy.data(), x.data(), n);
  });
  pool_elementwise("swiglu_forward", 1, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::swiglu_forward(o[0].data(), x.data(), u.data(), n)
      : cpu::ref::swiglu_forward(o[0].data(), x.data(), u.data(), n);
  }, 1e-6);
  pool_elementwise("swiglu_backward", 2, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::swiglu_backward(o[0].data(), o[1].data(), dy.data(), x.data(), u.data(), n)
      : cpu::ref::swiglu_backward(o[0].data(), o[1].data(), dy.data(), x.data(), u.data(), n);
  }, 1e-6);
  pool_elementwise("add_forward", 1, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::add_forward(o[0].data(), x.data(), u.data(), n) : cpu::ref::add_forward(o[0].data(), x.data(), u.data(), n);
  });
  pool_elementwise("add_backward", 2, [&](bool p, std::vector<VecF>& o) {
    p ? cpu::add_backward(o[0].data(), o[1].data(), dy.data(), n)
      : cpu::ref::add_backward(o[0].data(), o[1].data(), dy.data(), n);
  });
}

// ---- norms -------------------------------------------------------------------------------------

void pool_norms() {
  const int64_t H = 96, R = 5 * cpu::row_grain(H * 4) + 17;  // 6 blocks of rows
  const double eps = 1e-5;
  Rng rng(103);
  const VecF x = to_float(rng.vec(sz(R * H), -2, 2)), w = to_float(rng.vec(sz(H))),
             b = to_float(rng.vec(sz(H))), dy = to_float(rng.vec(sz(R * H))),
             dw0 = to_float(rng.vec(sz(H)));  // the accumulated gradients start non-zero
  VecF y_ref(sz(R * H)), mean(sz(R)), rstd(sz(R));
  cpu::ref::layernorm_forward(y_ref.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, H, eps);
  const auto ln_fwd = [&] {
    VecF y(sz(R * H)), mu(sz(R)), rs(sz(R));
    cpu::layernorm_forward(y.data(), mu.data(), rs.data(), x.data(), w.data(), b.data(), R, H, eps);
    Bytes out;
    append_bytes(out, y);
    append_bytes(out, mu);
    append_bytes(out, rs);
    return out;
  };
  Bytes ref_bytes;
  append_bytes(ref_bytes, y_ref);
  append_bytes(ref_bytes, mean);
  append_bytes(ref_bytes, rstd);
  report_pooled("layernorm_forward", ln_fwd() == ref_bytes ? 0.0 : 1.0, 0.0, same_bits_at_thread_counts(ln_fwd));
  // the statistics alone (the backward's recomputation): the forward's bits, pooled and ref
  const auto ln_stats = [&](bool pooled) {
    VecF mu(sz(R)), rs(sz(R));
    (pooled ? cpu::layernorm_stats<float> : cpu::ref::layernorm_stats<float>)(mu.data(), rs.data(), x.data(), R,
                                                                               H, eps);
    Bytes out;
    append_bytes(out, mu);
    append_bytes(out, rs);
    return out;
  };
  Bytes stats_bytes;
  append_bytes(stats_bytes, mean);
  append_bytes(stats_bytes, rstd);
  report("pool/layernorm_stats ref = the forward's mean, rstd", ln_stats(false) == stats_bytes ? 0.0 : 1.0, 0.0);
  report_pooled("layernorm_stats", ln_stats(true) == stats_bytes ? 0.0 : 1.0, 0.0,
                same_bits_at_thread_counts([&] { return ln_stats(true); }));

  // backward: dx is ref's bits; dw, db are summed per block, then over blocks
  const auto ln_bwd = [&](bool pooled, VecF& dx, VecF& dw, VecF& db) {
    dx.assign(sz(R * H), 0.f);
    dw = dw0;
    db = dw0;
    (pooled ? cpu::layernorm_backward<float> : cpu::ref::layernorm_backward<float>)(
        dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), R, H);
  };
  VecF dx_r, dw_r, db_r, dx_p, dw_p, db_p;
  ln_bwd(false, dx_r, dw_r, db_r);
  ln_bwd(true, dx_p, dw_p, db_p);
  report_pooled("layernorm_backward", norm_err(dx_p, dx_r), 0.0, same_bits_at_thread_counts([&] {
                  VecF dx, dw, db;
                  ln_bwd(true, dx, dw, db);
                  Bytes out;
                  append_bytes(out, dx);
                  append_bytes(out, dw);
                  append_bytes(out, db);
                  return out;
                }), "dx");
  report("pool/layernorm_backward dw, db vs ref", std::max(norm_err(dw_p, dw_r), norm_err(db_p, db_r)), kRefTol);

  cpu::ref::rmsnorm_forward(y_ref.data(), rstd.data(), x.data(), w.data(), R, H, eps);
  const auto rms_fwd = [&] {
    VecF y(sz(R * H)), rs(sz(R));
    cpu::rmsnorm_forward(y.data(), rs.data(), x.data(), w.data(), R, H, eps);
    Bytes out;
    append_bytes(out, y);
    append_bytes(out, rs);
    return out;
  };
  ref_bytes.clear();
  append_bytes(ref_bytes, y_ref);
  append_bytes(ref_bytes, rstd);
  report_pooled("rmsnorm_forward", rms_fwd() == ref_bytes ? 0.0 : 1.0, 0.0, same_bits_at_thread_counts(rms_fwd));
  const auto rms_stats = [&](bool pooled) {
    VecF rs(sz(R));
    (pooled ? cpu::rmsnorm_stats<float> : cpu::ref::rmsnorm_stats<float>)(rs.data(), x.data(), R, H, eps);
    Bytes out;
    append_bytes(out, rs);
    return out;
  };
  stats_bytes.clear();
  append_bytes(stats_bytes, rstd);
  report("pool/rmsnorm_stats ref = the forward's rstd", rms_stats(false) == stats_bytes ? 0.0 : 1.0, 0.0);
  report_pooled("rmsnorm_stats", rms_stats(true) == stats_bytes ? 0.0 : 1.0, 0.0,
                same_bits_at_thread_counts([&] { return rms_stats(true); }));

  const auto rms_bwd = [&](bool pooled, VecF& dx, VecF& dw) {
    dx.assign(sz(R * H), 0.f);
    dw = dw0;
    (pooled ? cpu::rmsnorm_backward<float> : cpu::ref::rmsnorm_backward<float>)(
        dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), R, H);
  };
  rms_bwd(false, dx_r, dw_r);
  rms_bwd(true, dx_p, dw_p);
  report_pooled("rmsnorm_backward", norm_err(dx_p, dx_r), 0.0, same_bits_at_thread_counts([&] {
                  VecF dx, dw;
                  rms_bwd(true, dx, dw);
                  Bytes out;
                  append_bytes(out, dx);
                  append_bytes(out, dw);
                  return out;
                }), "dx");
  report("pool/rmsnorm_backward dw vs ref", norm_err(dw_p, dw_r), kRefTol);
}

// ---- losses ------------------------------------------------------------------------------------

void pool_losses() {
  const int64_t V = 300, T = 3 * cpu::row_grain(V * 4) + 11;  // 4 blocks of rows
  Rng rng(104);
  const VecF logits = to_float(rng.vec(sz(T * V), -5, 5));
  const Ints labels = rng.ints(sz(T), 0, int32_t(V - 1));
  std::vector<uint8_t> mask(sz(T));
  for (int64_t t = 0; t < T; t++) mask[size_t(t)] = t % 5 != 2;  // some rows masked out
  const double loss_tokens = 123;

  const auto ce = [&](bool pooled) {
    VecF lse(sz(T)), dlogits(sz(T * V));
    const auto fwd = pooled ? cpu::cross_entropy_forward<float> : cpu::ref::cross_entropy_forward<float>;
    const auto bwd = pooled ? cpu::cross_entropy_backward<float> : cpu::ref::cross_entropy_backward<float>;
    const VecF loss = {fwd(lse.data(), logits.data(), labels.data(), mask.data(), loss_tokens, T, V)};
    bwd(dlogits.data(), 0.5f, logits.data(), lse.data(), labels.data(), mask.data(), loss_tokens, T, V);
    Bytes out;
    append_bytes(out, loss);
    append_bytes(out, lse);
    append_bytes(out, dlogits);
    return out;
  };
  report_pooled("cross_entropy forward, backward", ce(true) == ce(false) ? 0.0 : 1.0, 0.0,
                same_bits_at_thread_counts([&] { return ce(true); }));

  // vocab_logsumexp: pooled rows (no ref twin: its row loop is the formula fwd/vocab_parallel_ce checks)
  const auto vlse = [&] {
    VecF lse(sz(T)), dl(sz(T * V));
    const VecF dy = to_float(Rng(105).vec(sz(T)));
    cpu::vocab_logsumexp_forward(lse.data(), logits.data(), T, V);
    cpu::vocab_logsumexp_backward(dl.data(), dy.data(), logits.data(), lse.data(), T, V);
    Bytes out;
    append_bytes(out, lse);
    append_bytes(out, dl);
    return out;
  };
  report_bool("pool/vocab_logsumexp forward, backward same bytes at 1, 2, 3 threads",
              same_bits_at_thread_counts(vlse));
}

}  // namespace

void pool_checks() {
  pool_itself();
  pool_optimizer();
  pool_activations();
  pool_norms();
  pool_losses();
}

// ---- --bench -----------------------------------------------------------------------------------

namespace {
// pooled(…) at 1 and at 2 threads, against ref
template <typename Pooled, typename Ref>
void pool_bench_line(const std::string& name, Pooled&& pooled, Ref&& ref) {
  const int before = lfc::kernelThreads();
  lfc::setKernelThreads(1);
  const double one = median_ms(pooled, 51);
  lfc::setKernelThreads(2);
  const double two = median_ms(pooled, 51);
  lfc::setKernelThreads(before);
  const double r = median_ms(ref, 51);
  std::printf("%-48s 2 threads %7.3f ms   1 thread %7.3f ms   ref %7.3f ms   ×%.1f\n", name.c_str(), two, one, r,
              r / two);
}
}  // namespace

void pool_bench() {
  std::printf("pooled kernels (core/thread_pool.h), float32, median of 51 runs\n");
  // tiny-vlm's decoder: T = 3 microbatches × 128 tokens, H = 128, F = 384; a vocab of 1024
  const int64_t T = 384, H = 128, F = 384, V = 1024, n = T * F;
  Rng rng(7);
  const VecF a = to_float(rng.vec(sz(n))), b = to_float(rng.vec(sz(n))), dy = to_float(rng.vec(sz(n)));
  VecF y(sz(n)), y2(sz(n));
  pool_bench_line("swiglu_forward T·F = 384·384",
                  [&] { cpu::swiglu_forward(y.data(), a.data(), b.data(), n); },
                  [&] { cpu::ref::swiglu_forward(y.data(), a.data(), b.data(), n); });
  pool_bench_line("swiglu_backward",
                  [&] { cpu::swiglu_backward(y.data(), y2.data(), dy.data(), a.data(), b.data(), n); },
                  [&] { cpu::ref::swiglu_backward(y.data(), y2.data(), dy.data(), a.data(), b.data(), n); });
  pool_bench_line("gelu_backward T·F", [&] { cpu::gelu_backward(y.data(), dy.data(), a.data(), n); },
                  [&] { cpu::ref::gelu_backward(y.data(), dy.data(), a.data(), n); });
  VecF p = a, m(sz(n), 0.f), v(sz(n), 0.f);
  const cpu::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5};
  pool_bench_line("adamw_step n = 147456", [&] { cpu::adamw_step(p.data(), b.data(), m.data(), v.data(), n, hp, 2); },
                  [&] { cpu::ref::adamw_step(p.data(), b.data(), m.data(), v.data(), n, hp, 2); });
  volatile double sink = 0;
  pool_bench_line("sum_squares n = 147456", [&] { sink = cpu::sum_squares(a.data(), n); },
                  [&] { sink = cpu::ref::sum_squares(a.data(), n); });
  VecF x(sz(T * H)), w(sz(H)), rstd(sz(T)), dx(sz(T * H)), dw(sz(H));
  std::copy(a.begin(), a.begin() + T * H, x.begin());
  std::copy(b.begin(), b.begin() + H, w.begin());
  pool_bench_line("rmsnorm_forward R = 384, H = 128",
                  [&] { cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, H, 1e-6); },
                  [&] { cpu::ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, H, 1e-6); });
  pool_bench_line("rmsnorm_backward",
                  [&] { cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, H); },
                  [&] {
                    cpu::ref::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, H);
                  });
  const VecF logits = to_float(rng.vec(sz(T * V), -4, 4));
  const Ints labels = rng.ints(sz(T), 0, int32_t(V - 1));
  const std::vector<uint8_t> mask(sz(T), 1);
  VecF lse(sz(T)), dlogits(sz(T * V));
  pool_bench_line("cross_entropy forward + backward T = 384, V = 1024",
                  [&] {
                    cpu::cross_entropy_forward(lse.data(), logits.data(), labels.data(), mask.data(), 384.0, T, V);
                    cpu::cross_entropy_backward(dlogits.data(), 1.f, logits.data(), lse.data(), labels.data(),
                                                mask.data(), 384.0, T, V);
                  },
                  [&] {
                    cpu::ref::cross_entropy_forward(lse.data(), logits.data(), labels.data(), mask.data(), 384.0, T,
                                                    V);
                    cpu::ref::cross_entropy_backward(dlogits.data(), 1.f, logits.data(), lse.data(), labels.data(),
                                                     mask.data(), 384.0, T, V);
                  });
}
