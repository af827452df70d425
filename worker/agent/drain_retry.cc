#include "worker/agent/drain_retry.h"

namespace pipetrain {

bool IsStaleSessionRefusal(const absl::Status& drain) { return absl::IsUnauthenticated(drain); }

bool AsksDrainAfterDelay(const std::optional<absl::Status>& first, bool hurried) {
  if (!first.has_value()) return true;
  if (hurried) return false;
  return absl::IsUnavailable(*first) || absl::IsDeadlineExceeded(*first) ||
         IsStaleSessionRefusal(*first);
}

}  // namespace pipetrain
