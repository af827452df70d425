#include "common/testing/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/philox.h"

namespace pipetrain {
namespace testing {
namespace {

constexpr int kReportedMismatches = 5;

// "[1, 3]" for flat index 11 of shape [4, 8].
std::string MultiIndex(const Shape& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 0) break;
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return ShapeToString(index);
}

// Collects failed comparisons: how many, the first few, and the worst.
class MismatchLog {
 public:
  // Names of the two compared quantities in reports.
  MismatchLog(std::string actual_name, std::string expected_name)
      : actual_name_(std::move(actual_name)), expected_name_(std::move(expected_name)) {}

  // Records the comparison; returns whether it passed. NaN fails.
  bool Compare(const std::string& label, double actual, double expected, double tolerance) {
    ++checks_;
    const double error = std::fabs(actual - expected);
    if (error <= tolerance) return true;
    std::string line =
        absl::StrFormat("%s: %s=%.8g %s=%.8g error=%.3g (tolerance %.3g)", label, actual_name_,
                        actual, expected_name_, expected, error, tolerance);
    if (mismatches_ < kReportedMismatches) first_.push_back(line);
    // NaN errors rank as the worst.
    if (mismatches_ == 0 || std::isnan(error) || error > worst_error_) {
      worst_error_ = std::isnan(error) ? INFINITY : error;
      worst_ = line;
    }
    ++mismatches_;
    return false;
  }

  bool ok() const { return mismatches_ == 0; }

  // "3 of 50 checks fail; first mismatches: ...; worst: ...".
  std::string Summary() const {
    return absl::StrCat(mismatches_, " of ", checks_,
                        " checks fail; first mismatches: ", absl::StrJoin(first_, "; "),
                        "; worst: ", worst_);
  }

 private:
  std::string actual_name_;
  std::string expected_name_;
  int64_t checks_ = 0;
  int64_t mismatches_ = 0;
  double worst_error_ = 0.0;
  std::vector<std::string> first_;
  std::string worst_;
};

// Indices to check: all of [0, n) when n <= max, else `max` distinct ones by
// a partial Fisher-Yates shuffle keyed by (seed, input), sorted for reports.
std::vector<int64_t> ChooseElements(int64_t n, int max, uint64_t seed, uint32_t input) {
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  if (n <= max) return all;
  for (int i = 0; i < max; ++i) {
    uint64_t j = i + UniformIndex(seed, input, static_cast<uint32_t>(i), 0, n - i);
    std::swap(all[i], all[j]);
  }
  all.resize(max);
  std::sort(all.begin(), all.end());
  return all;
}

// Perturbation size for an element of value x.
double StepFor(double step, float x) { return step * std::max(1.0, std::fabs(double{x})); }

// Central difference in element j of `input`, using the fp32-rounded steps.
void CheckElement(const std::function<double()>& loss, const GradInput& input, int64_t j,
                  const GradCheckOptions& options, MismatchLog* log) {
  float* x = input.value->data();
  const float original = x[j];
  const double h = StepFor(options.step, original);
  x[j] = static_cast<float>(original + h);
  const double up = double{x[j]} - original;
  const double loss_up = loss();
  x[j] = static_cast<float>(original - h);
  const double down = original - double{x[j]};
  const double loss_down = loss();
  x[j] = original;
  const double numeric = (loss_up - loss_down) / (up + down);
  const double analytic = input.analytic_grad[j];
  log->Compare(absl::StrCat("index ", j, " ", MultiIndex(input.value->shape(), j)), analytic,
               numeric, options.atol + options.rtol * std::fabs(numeric));
}

// Moves all elements at once along a random unit direction and compares
// (L(x+d+) - L(x-d-)) with <grad, d+ + d->, both divided by 2 * step.
void CheckDirection(const std::function<double()>& loss, const GradInput& input, int direction,
                    uint32_t input_index, const GradCheckOptions& options, MismatchLog* log) {
  const int64_t n = input.value->numel();
  std::vector<float> v(n);
  const uint64_t stream = (uint64_t{input_index} << 32) | static_cast<uint32_t>(direction);
  FillNormal(options.seed, stream ^ 0x9e3779b97f4a7c15ull, 0.0f, 1.0f, v.data(), n);
  double norm = 0.0;
  for (float e : v) norm += double{e} * e;
  norm = std::sqrt(norm);
  const Tensor saved = input.value->Clone();
  float* x = input.value->data();
  std::vector<double> total_step(n);  // d+ + d-, the fp32-rounded steps.
  double losses[2];
  for (int s = 0; s < 2; ++s) {
    const double sign = s == 0 ? 1.0 : -1.0;
    for (int64_t k = 0; k < n; ++k) {
      const double d = StepFor(options.step, saved[k]) * v[k] / norm;
      x[k] = static_cast<float>(saved[k] + sign * d);
      total_step[k] += sign * (double{x[k]} - saved[k]);
    }
    losses[s] = loss();
  }
  input.value->CopyFrom(saved);
  const double numeric = (losses[0] - losses[1]) / (2.0 * options.step);
  double analytic = 0.0;
  for (int64_t k = 0; k < n; ++k) analytic += double{input.analytic_grad[k]} * total_step[k];
  analytic /= 2.0 * options.step;
  log->Compare(absl::StrCat("random direction ", direction), analytic, numeric,
               options.atol + options.rtol * std::fabs(numeric));
}

absl::Status ValidateArguments(const std::vector<GradInput>& inputs,
                               const GradCheckOptions& options) {
  if (!(options.step > 0) || !(options.rtol >= 0) || !(options.atol >= 0) ||
      options.max_elements < 0 || options.directions < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GradCheckOptions out of range: step=%g (> 0), rtol=%g, atol=%g (>= 0), "
        "max_elements=%d, directions=%d (>= 0)",
        options.step, options.rtol, options.atol, options.max_elements, options.directions));
  }
  for (const GradInput& input : inputs) {
    if (input.value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient check input '", input.name, "' has a null value pointer"));
    }
    if (input.analytic_grad.numel() != input.value->numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient check input '", input.name, "' has shape ",
                       ShapeToString(input.value->shape()), " but its analytic gradient has shape ",
                       ShapeToString(input.analytic_grad.shape()), "; pass dL/d", input.name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckGradients(const std::function<double()>& loss,
                            const std::vector<GradInput>& inputs, const GradCheckOptions& options) {
  absl::Status valid = ValidateArguments(inputs, options);
  if (!valid.ok()) return valid;
  std::vector<std::string> failures;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const GradInput& input = inputs[i];
    const uint32_t input_index = static_cast<uint32_t>(i);
    MismatchLog log("analytic", "numeric");
    for (int64_t j :
         ChooseElements(input.value->numel(), options.max_elements, options.seed, input_index)) {
      CheckElement(loss, input, j, options, &log);
    }
    for (int d = 0; d < options.directions && input.value->numel() > 0; ++d) {
      CheckDirection(loss, input, d, input_index, options, &log);
    }
    if (!log.ok()) {
      failures.push_back(
          absl::StrFormat("gradient check of input '%s' (shape %s) failed, |numeric - analytic| > "
                          "atol + rtol * |numeric| with atol=%g rtol=%g step=%g: %s",
                          input.name, ShapeToString(input.value->shape()), options.atol,
                          options.rtol, options.step, log.Summary()));
    }
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(failures, "\n"));
}

absl::Status CheckClose(const std::string& name, const Tensor& actual,
                        const std::vector<double>& expected, double atol, double rtol) {
  if (actual.numel() != static_cast<int64_t>(expected.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name, "' has ", actual.numel(), " elements but the reference has ", expected.size()));
  }
  MismatchLog log("actual", "expected");
  for (int64_t i = 0; i < actual.numel(); ++i) {
    log.Compare(absl::StrCat("index ", i, " ", MultiIndex(actual.shape(), i)), actual[i],
                expected[i], atol + rtol * std::fabs(expected[i]));
  }
  if (log.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "'%s' (shape %s) differs from the reference, |actual - expected| > atol + rtol * "
      "|expected| with atol=%g rtol=%g: %s",
      name, ShapeToString(actual.shape()), atol, rtol, log.Summary()));
}

Tensor RandomTensor(const Shape& shape, uint64_t seed, float scale) {
  Tensor t = Tensor::Zeros(shape);
  FillNormal(seed, HashName("pipetrain.testing.RandomTensor"), 0.0f, scale, t.data(), t.numel());
  return t;
}

double DotLoss(const Tensor& y, const Tensor& w) {
  PT_CHECK(y.numel() == w.numel())
      << "DotLoss of " << ShapeToString(y.shape()) << " and " << ShapeToString(w.shape());
  double sum = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) sum += double{y[i]} * w[i];
  return sum;
}

}  // namespace testing
}  // namespace pipetrain
