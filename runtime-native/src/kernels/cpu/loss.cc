#include "loss.h"

#include <algorithm>
#include <cmath>

namespace lfc::cpu {

namespace {
void check_args(const char* kernel, const int32_t* labels, const uint8_t* mask, double loss_tokens,
                int64_t T, int64_t V) {
  LFC_KERNEL_CHECK(loss_tokens > 0, kernel, ": loss_tokens is ", loss_tokens,
                   "; a global batch with no loss token is an error");
  for (int64_t t = 0; t < T; t++)
    LFC_KERNEL_CHECK(!mask[t] || (labels[t] >= 0 && labels[t] < V), kernel, ": labels[", t, "] = ",
                     labels[t], " is outside the vocab of ", V);
}
}  // namespace

template <typename Real>
Real cross_entropy_forward(Real* lse, const Real* logits, const int32_t* labels, const uint8_t* mask,
                           double loss_tokens, int64_t T, int64_t V) {
  check_args("cross_entropy_forward", labels, mask, loss_tokens, T, V);
  double total = 0;
  for (int64_t t = 0; t < T; t++) {
    lse[t] = Real(0);
    if (!mask[t]) continue;
    const Real* lt = logits + t * V;  // (V)
    const double m = *std::max_element(lt, lt + V);
    double sum = 0;
    for (int64_t v = 0; v < V; v++) sum += std::exp(double(lt[v]) - m);
    const double l = m + std::log(sum);
    lse[t] = Real(l);
    total += l - double(lt[labels[t]]);
  }
  return Real(total / loss_tokens);
}

template <typename Real>
void cross_entropy_backward(Real* dlogits, Real g, const Real* logits, const Real* lse,
                            const int32_t* labels, const uint8_t* mask, double loss_tokens, int64_t T,
                            int64_t V) {
  check_args("cross_entropy_backward", labels, mask, loss_tokens, T, V);
  const Real scale = Real(double(g) / loss_tokens);
  for (int64_t t = 0; t < T; t++) {
    Real* dt = dlogits + t * V;  // (V)
    if (!mask[t]) {
      std::fill(dt, dt + V, Real(0));
      continue;
    }
    const Real* lt = logits + t * V;  // (V)
    const Real l = lse[t];
    for (int64_t v = 0; v < V; v++) dt[v] = scale * std::exp(lt[v] - l);
    dt[labels[t]] -= scale;
  }
}

template float cross_entropy_forward<float>(float*, const float*, const int32_t*, const uint8_t*,
                                            double, int64_t, int64_t);
template double cross_entropy_forward<double>(double*, const double*, const int32_t*, const uint8_t*,
                                              double, int64_t, int64_t);
template void cross_entropy_backward<float>(float*, float, const float*, const float*, const int32_t*,
                                            const uint8_t*, double, int64_t, int64_t);
template void cross_entropy_backward<double>(double*, double, const double*, const double*,
                                             const int32_t*, const uint8_t*, double, int64_t, int64_t);

}  // namespace lfc::cpu
