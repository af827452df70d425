#include "cli/exit_codes.h"

namespace pipetrain {

int ExitCodeFor(absl::StatusCode code) {
  const int value = static_cast<int>(code);
  if (code == absl::StatusCode::kOk) return kExitOk;
  if (value < 1 || value > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return kExitStatusBase + static_cast<int>(absl::StatusCode::kUnknown);
  }
  return kExitStatusBase + value;
}

}  // namespace pipetrain
