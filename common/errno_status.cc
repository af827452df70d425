#include "common/errno_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status ErrnoStatus(int error_number, absl::string_view message) {
  absl::Status status = absl::ErrnoToStatus(error_number, message);
  // A no-op on OK (error_number 0), which keeps no payload.
  status.SetPayload(kErrnoPayloadUrl, absl::Cord(absl::StrCat(error_number)));
  return status;
}

std::optional<int> ErrnoOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrnoPayloadUrl);
  int error_number = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &error_number)) {
    return std::nullopt;
  }
  return error_number;
}

absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  absl::Status reworded(status.code(), message);
  status.ForEachPayload([&reworded](absl::string_view url, const absl::Cord& payload) {
    reworded.SetPayload(url, payload);
  });
  return reworded;
}

std::string StatusTextForUsers(const absl::Status& status) {
  return status.ToString(absl::StatusToStringMode::kWithNoExtraData);
}

}  // namespace pipetrain
