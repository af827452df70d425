#include "kernels/compress/error_feedback.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<std::string> ErrorFeedback::Compress(const Tensor& x, const Codec& codec,
                                                    CodecState* state, double* relative_error) {
  if (has_residual() && residual_.shape() != x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "error feedback: tensor ", ShapeToString(x.shape()), " does not match the stored residual ",
        ShapeToString(residual_.shape()), "; call Flush() when the tensor shape changes"));
  }
  Tensor y = x.Clone();
  if (has_residual()) {
    for (int64_t i = 0; i < y.numel(); ++i) y[i] += residual_[i];
  }
  ASSIGN_OR_RETURN(std::string payload, codec.Encode(y, state));
  ASSIGN_OR_RETURN(Tensor decoded, codec.Decode(payload));
  if (decoded.shape() != y.shape()) {
    return absl::InternalError(absl::StrCat("error feedback: codec ", codec.name(), " decoded ",
                                            ShapeToString(decoded.shape()), " from ",
                                            ShapeToString(y.shape())));
  }
  double error_sq = 0, norm_sq = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    norm_sq += double{y[i]} * y[i];
    y[i] -= decoded[i];
    error_sq += double{y[i]} * y[i];
  }
  if (relative_error != nullptr) {
    *relative_error = norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : 0.0;
  }
  residual_ = std::move(y);
  return payload;
}

Tensor ErrorFeedback::Flush() {
  Tensor out = std::move(residual_);
  residual_ = Tensor();
  return out;
}

}  // namespace pipetrain
