#include "worker/train/divergence.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status CheckLossFinite(int64_t step, float loss) {
  if (std::isfinite(loss)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "training diverged: the loss of step ", step, " is ", std::isnan(loss) ? "nan" : "infinite",
      "; try a lower learning rate, a warm-up or gradient clipping (checkpoints of the steps "
      "just before may hold the diverging weights too)"));
}

absl::Status CheckWeightsAfterStep(int64_t step, const absl::Status& found) {
  if (found.ok()) return found;
  return absl::FailedPreconditionError(absl::StrCat(
      "training diverged: after step ", step, ", ", found.message(),
      " (that step's loss was still finite); try a lower learning rate, a warm-up or gradient "
      "clipping"));
}

}  // namespace pipetrain
