#include "common/rpc_status.h"

#include "absl/strings/match.h"
#include "common/proto_wire.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

// Field numbers (see the header).
constexpr int kStatusCode = 1, kStatusMessage = 2, kStatusDetails = 3;
constexpr int kAnyTypeUrl = 1, kAnyValue = 2;
constexpr int kBadRequestViolations = 1;
constexpr int kViolationField = 1, kViolationDescription = 2;

bool IsFieldPath(absl::string_view text) {
  if (text.empty() || !std::isalpha(static_cast<unsigned char>(text[0]))) return false;
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '[' &&
        c != ']') {
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<FieldViolation> FieldViolationsOf(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kOutOfRange) {
    return {};
  }
  const absl::string_view message = status.message();
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos || !IsFieldPath(message.substr(0, colon))) return {};
  return {{std::string(message.substr(0, colon)), std::string(message.substr(colon + 2))}};
}

std::string EncodeRpcStatus(const absl::Status& status) {
  std::string out = WireVarint(kStatusCode, static_cast<uint64_t>(status.code())) +
                    WireString(kStatusMessage, status.message());
  const std::vector<FieldViolation> violations = FieldViolationsOf(status);
  if (violations.empty()) return out;
  std::string bad_request;
  for (const FieldViolation& v : violations) {
    bad_request +=
        WireString(kBadRequestViolations, WireString(kViolationField, v.field) +
                                              WireString(kViolationDescription, v.description));
  }
  out += WireString(kStatusDetails, WireString(kAnyTypeUrl, kBadRequestTypeUrl) +
                                        WireString(kAnyValue, bad_request));
  return out;
}

absl::StatusOr<DecodedRpcStatus> DecodeRpcStatus(absl::string_view bytes) {
  absl::StatusOr<WireFields> status = ParseWireFields(bytes);
  if (!status.ok()) return status.status();
  DecodedRpcStatus out;
  out.code = static_cast<int>(status->Varint(kStatusCode));
  out.message = status->String(kStatusMessage);
  for (const std::string& any_bytes : status->Strings(kStatusDetails)) {
    absl::StatusOr<WireFields> any = ParseWireFields(any_bytes);
    if (!any.ok()) return any.status();
    if (any->String(kAnyTypeUrl) != kBadRequestTypeUrl) continue;
    absl::StatusOr<WireFields> bad_request = ParseWireFields(any->String(kAnyValue));
    if (!bad_request.ok()) return bad_request.status();
    for (const std::string& violation_bytes : bad_request->Strings(kBadRequestViolations)) {
      absl::StatusOr<WireFields> violation = ParseWireFields(violation_bytes);
      if (!violation.ok()) return violation.status();
      out.violations.push_back(
          {violation->String(kViolationField), violation->String(kViolationDescription)});
    }
  }
  return out;
}

std::string RpcStatusJson(const absl::Status& status) {
  nlohmann::json details = nlohmann::json::array();
  const std::vector<FieldViolation> violations = FieldViolationsOf(status);
  if (!violations.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const FieldViolation& v : violations) {
      list.push_back({{"field", v.field}, {"description", v.description}});
    }
    details.push_back({{"@type", kBadRequestTypeUrl}, {"fieldViolations", list}});
  }
  nlohmann::json body = {{"code", static_cast<int>(status.code())},
                         {"message", std::string(status.message())},
                         {"details", details}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool OutcomeUnknown(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

bool SaysNothingSubmitted(const absl::Status& status) {
  return absl::StrContains(status.message(), kNothingSubmitted);
}

}  // namespace pipetrain
