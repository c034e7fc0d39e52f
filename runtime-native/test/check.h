// The harness of kernel_check (kernel_check.cc, bf16_check.cc): report lines, random inputs,
// error measures. Header-only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/balance.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/rope.h"
#include "ops/basic_kernels.h"  // header-only: group_slice's block

namespace cpu = lfc::cpu;
using Vec = std::vector<double>;
using VecF = std::vector<float>;
using Ints = std::vector<int32_t>;

// ---- harness ----------------------------------------------------------------------------------

constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-6;     // normalized error of a backward against finite differences
constexpr double kRefTol = 1e-5;    // normalized error of an optimized kernel against ref, in float
constexpr double kExactTol = 1e-12; // a double forward against the formula
inline const std::vector<uint64_t> kSeeds = {1, 2, 3};

inline int g_checks = 0, g_failures = 0;

inline void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // NaN fails
  g_checks++;
  if (!pass) g_failures++;
  std::printf("%-52s %10.3e  (tol %.0e)  %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
}

// A condition with no meaningful magnitude: error 0 when it holds, 1 when not.
inline void report_bool(const std::string& name, bool ok) { report(name, ok ? 0.0 : 1.0, 0.0); }

// Max that keeps a NaN once seen.
inline void track_max(double& m, double v) {
  if (std::isnan(m)) return;
  if (std::isnan(v) || v > m) m = v;
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double uniform(double lo = -1, double hi = 1) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  int32_t integer(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(gen); }
  Vec vec(size_t n, double lo = -1, double hi = 1) {
    Vec v(n);
    for (double& x : v) x = uniform(lo, hi);
    return v;
  }
  Ints ints(size_t n, int32_t lo, int32_t hi) {
    Ints v(n);
    for (int32_t& x : v) x = integer(lo, hi);
    return v;
  }
};

inline VecF to_float(const Vec& v) { return VecF(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) { return std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }

// max|a − ref| / max|ref| (the absolute error when ref is all zero).
template <typename A, typename B>
double norm_err(const std::vector<A>& a, const std::vector<B>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); i++) {
    track_max(diff, std::abs(double(a[i]) - double(ref[i])));
    track_max(scale, std::abs(double(ref[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Central differences of f with respect to x (perturbed in place, restored), against grad:
// max|grad − fd| / max|fd|.
inline double fd_error(Vec& x, const Vec& grad, const std::function<double()>& f) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    x[i] = x0 + kFdStep;
    const double fp = f();
    x[i] = x0 - kFdStep;
    const double fm = f();
    x[i] = x0;
    const double fd = (fp - fm) / (2 * kFdStep);
    track_max(diff, std::abs(grad[i] - fd));
    track_max(scale, std::abs(fd));
  }
  return scale > 0 ? diff / scale : diff;
}

// Max error per named gradient over the seeds of one check, reported as one line each.
struct FdReport {
  std::string kernel;
  std::vector<std::pair<std::string, double>> errs;
  void add(const std::string& what, double e) {
    for (auto& [name, m] : errs)
      if (name == what) return track_max(m, e);
    errs.push_back({what, e});
  }
  void print() const {
    for (auto& [name, m] : errs) report("fd/" + kernel + " " + name, m, kFdTol);
  }
};

// Segments (T) from runs of (id, length).
inline Ints segments_of(const std::vector<std::pair<int32_t, int>>& runs) {
  Ints s;
  for (auto [id, len] : runs) s.insert(s.end(), len, id);
  return s;
}

template <typename F>
bool throws_kernel_error(F&& f, const char* must_contain) {
  try {
    f();
  } catch (const cpu::KernelError& e) {
    return std::strstr(e.what(), must_contain) != nullptr;
  }
  return false;
}

// --bench: the median time of f over reps runs (after one warm-up), and one report line
template <typename F>
inline double median_ms(F&& f, int reps = 21) {
  f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

inline void bench_line(const std::string& name, double opt_ms, double ref_ms) {
  std::printf("%-62s opt %8.3f ms   ref %8.3f ms   ×%.1f\n", name.c_str(), opt_ms, ref_ms, ref_ms / opt_ms);
}

// bf16_check.cc: the bf16/ tier (bf16 storage against the f32 kernels) and the exact checks of
// the bf16 conversion.
void bf16_checks();

// sum_check.cc: the sum/ tier (comm/sum.h's sumParts against a plain left-to-right sum, bit for bit).
void sum_checks();

// pool_check.cc: the pool/ tier (the kernel thread pool; pooled kernels against ref and across
// thread counts).
void pool_checks();
// --bench: the pooled kernels at tiny-vlm's shapes, on 1 and 2 threads, against ref
void pool_bench();
