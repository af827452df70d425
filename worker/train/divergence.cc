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

}  // namespace pipetrain
