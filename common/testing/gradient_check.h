// Finite-difference gradient checking and reference comparison for kernel tests.
//
//   Tensor x = RandomTensor({4, 8}, /*seed=*/1);
//   Tensor w = RandomTensor({4, 8}, /*seed=*/2);   // projection weights
//   Tensor y = Tensor::Zeros({4, 8}), dx = Tensor::Zeros({4, 8});
//   auto loss = [&] { GeluForward(x.data(), x.numel(), y.data()); return DotLoss(y, w); };
//   GeluBackward(x.data(), w.data(), x.numel(), dx.data());   // dL/dy = w
//   EXPECT_TRUE(CheckGradients(loss, {{"x", &x, dx}}).ok());
//
// An op with a non-scalar output y is checked through the projection loss
// L = sum_i w_i y_i with fixed random w: its gradient is the op's backward
// applied to dy = w, and random w makes every output element matter.
//
// Why the default tolerances work for fp32 kernels. A central difference
// (L(x+h) - L(x-h)) / 2h has two errors:
//   * rounding: the kernel computes L in fp32, so each evaluation carries an
//     error of about eps32 * |L| (eps32 ~ 6e-8); divided by 2h this is
//     ~ eps32 * |L| / h ~ 6e-6 * |L| for h = 1e-2.
//   * truncation: h^2 * |f'''| / 6 ~ 2e-5 * |f'''|.
// For O(1) losses and O(1) inputs both are ~1e-5 relative to the gradient,
// three orders of magnitude below rtol = 2e-2; atol = 1e-4 absorbs them for
// gradient elements that are themselves near zero. A wrong term in a backward
// pass (a missing factor, a dropped branch, a wrong sign) gives an O(1)
// relative error, far above rtol, so the check still fails where it should.
// The loss is summed in double (DotLoss) so the summation adds no fp32 error;
// only the output elements an input actually affects contribute noise.
//
// The perturbation actually applied is the fp32-rounded one:
// (float)(x + h) - x rather than h, so no error comes from rounding the
// perturbed input.
//
// Thread-safety: CheckGradients mutates the input tensors while it runs (and
// restores them bit-exactly); nothing else may touch them concurrently.
#ifndef PIPETRAIN_COMMON_TESTING_GRADIENT_CHECK_H_
#define PIPETRAIN_COMMON_TESTING_GRADIENT_CHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace pipetrain {
namespace testing {

struct GradCheckOptions {
  // Central-difference step: element j moves by step * max(1, |x_j|).
  double step = 1e-2;
  // Element j passes when |numeric - analytic| <= atol + rtol * |numeric|.
  double rtol = 2e-2;
  double atol = 1e-4;
  // Elements checked per input: all when numel <= max_elements, otherwise a
  // random subset of this size (drawn from `seed`). 0 skips element checks.
  int max_elements = 48;
  // Extra checks per input along random unit directions v (all elements move
  // at once, element j by step * max(1, |x_j|) * v_j): the directional
  // difference (L(x+d) - L(x-d)) / 2 step against <grad, d> / step, with the
  // same tolerance. They cover the elements the subset left out.
  int directions = 2;
  uint64_t seed = 1;
};

struct GradInput {
  std::string name;      // Used in error messages.
  Tensor* value;         // Perturbed in place; must be non-null.
  Tensor analytic_grad;  // dL/dvalue from the backward pass; numel == value->numel().
};

// Compares each input's analytic gradient with central differences of
// `loss`. `loss` must recompute the scalar loss from the CURRENT contents of
// the input tensors on every call (the checker perturbs elements in place and
// restores them bit-exactly before returning, also on failure).
// Returns:
//   OK when every checked element and direction is within tolerance;
//   INVALID_ARGUMENT when an input is null, its gradient's element count
//     differs from the input's, or an option is out of range (step <= 0,
//     negative rtol/atol/max_elements/directions);
//   INTERNAL when some check fails (including NaN/inf in either value). The
//     message names the input, the number of mismatches, the first 5 (flat
//     index, multi-index, analytic, numeric, error) and the worst one.
absl::Status CheckGradients(const std::function<double()>& loss,
                            const std::vector<GradInput>& inputs,
                            const GradCheckOptions& options = {});

// Compares `actual` elementwise with a (typically double-precision naive)
// reference: element i passes when |actual_i - expected_i| <= atol + rtol *
// |expected_i|. Returns OK, INVALID_ARGUMENT when the sizes differ, or
// INTERNAL naming `name`, the mismatch count, the first 5 mismatches and the
// worst one (NaN counts as a mismatch).
absl::Status CheckClose(const std::string& name, const Tensor& actual,
                        const std::vector<double>& expected, double atol, double rtol);

// A tensor of N(0, scale^2) values; element i depends only on (seed, i).
Tensor RandomTensor(const Shape& shape, uint64_t seed, float scale = 1.0f);

// L = sum_i w_i * y_i accumulated in double, so dL/dy = w. Requires equal
// element counts (PT_CHECK).
double DotLoss(const Tensor& y, const Tensor& w);

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_GRADIENT_CHECK_H_
