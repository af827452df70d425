#include "coordinator/api/grpc_status.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc_status.h"
#include "common/utf8_prefix.h"

namespace pipetrain {
namespace {

// `message` cut to at most kMaxStatusMessageBytes (on a UTF-8 character's
// first byte) and a note of how much was left out; unchanged when short.
std::string Bounded(absl::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  const absl::string_view kept =
      Utf8Prefix(message, kMaxStatusMessageBytes - 32);  // room for the note
  return absl::StrCat(kept, " ... [", message.size() - kept.size(), " more bytes]");
}

}  // namespace

absl::Status BoundedStatus(const absl::Status& status) {
  if (status.message().size() <= kMaxStatusMessageBytes) return status;
  return absl::Status(status.code(), Bounded(status.message()));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode are both google.rpc.Code (0..16).
  const auto code = static_cast<grpc::StatusCode>(status.code());
  // The details are made from the message (its field violation too), so
  // from the cut one.
  const absl::Status bounded = BoundedStatus(status);
  const std::string message(bounded.message());
  if (FieldViolationsOf(bounded).empty()) return grpc::Status(code, message);
  return grpc::Status(code, message, EncodeRpcStatus(bounded));
}

absl::Duration CallerWaitBudget(std::chrono::system_clock::time_point deadline, absl::Time now) {
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteDuration();
  const absl::Duration left = absl::FromChrono(deadline) - now;
  if (left <= absl::ZeroDuration()) return absl::ZeroDuration();
  return left - std::min(left / 5, absl::Seconds(1));
}

}  // namespace pipetrain
