// google.rpc.Status for pipetrain's errors: the JSON error body of every
// REST endpoint and the binary details (grpc-status-details-bin) of gRPC
// errors, with google.rpc.BadRequest field violations naming the field and
// the limit a request broke.
//
// Where violations come from: pipetrain's validators word every
// INVALID_ARGUMENT / OUT_OF_RANGE message as "<field path>: <what is
// wrong>" (e.g. "spec.training.steps: 0 is below the minimum of 1";
// spec/job_spec.cc Invalid()), so the field is the text before the first
// ": " when that text is a field path (letters, digits, '_', '.', '[', ']';
// starting with a letter). Other messages carry no violation.
//
// Debian ships no google/rpc/*.proto, so the messages are written by hand
// in their published wire format (common/proto_wire.h):
//   google.rpc.Status        { int32 code = 1; string message = 2;
//                              repeated google.protobuf.Any details = 3; }
//   google.protobuf.Any      { string type_url = 1; bytes value = 2; }
//   google.rpc.BadRequest    { repeated FieldViolation field_violations = 1; }
//   BadRequest.FieldViolation { string field = 1; string description = 2; }
// Thread-safe (pure functions).
#ifndef PIPETRAIN_COMMON_RPC_STATUS_H_
#define PIPETRAIN_COMMON_RPC_STATUS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

inline constexpr char kBadRequestTypeUrl[] = "type.googleapis.com/google.rpc.BadRequest";

struct FieldViolation {
  std::string field;        // e.g. "spec.training.steps", "page_size"
  std::string description;  // what is wrong, naming the limit
  bool operator==(const FieldViolation& other) const {
    return field == other.field && description == other.description;
  }
};

// The violations `status` carries by the convention above (none for OK and
// for codes other than INVALID_ARGUMENT and OUT_OF_RANGE).
std::vector<FieldViolation> FieldViolationsOf(const absl::Status& status);

// `status` (not OK) as google.rpc.Status bytes, with a BadRequest detail
// when it carries violations; for grpc::Status's error_details.
std::string EncodeRpcStatus(const absl::Status& status);

// What EncodeRpcStatus wrote (for clients and tests): the code, message and
// BadRequest violations; other details are skipped. INVALID_ARGUMENT when
// `bytes` is not a google.rpc.Status encoding.
struct DecodedRpcStatus {
  int code = 0;
  std::string message;
  std::vector<FieldViolation> violations;
};
absl::StatusOr<DecodedRpcStatus> DecodeRpcStatus(absl::string_view bytes);

// google.rpc.Status in proto3 JSON: {"code": 3, "message": "...",
// "details": [{"@type": "type.googleapis.com/google.rpc.BadRequest",
// "fieldViolations": [{"field": ..., "description": ...}]}]} ("details"
// always present, empty without violations). Invalid UTF-8 in the message
// (echoed input) is replaced, never thrown on.
std::string RpcStatusJson(const absl::Status& status);

// Whether a call that failed with `status` may still have taken effect, so
// that only a retry made safe to repeat may follow it: UNAVAILABLE (it may
// have been refused before it arrived, or its answer lost in a failover)
// or DEADLINE_EXCEEDED.
bool OutcomeUnknown(const absl::Status& status);

// What a coordinator's UNAVAILABLE says when it is sure nothing was done
// (the state store refused the job, a path is held for a minute more): a
// retry is welcome, and the outcome is known. SaysNothingSubmitted: the
// message holds it.
inline constexpr char kNothingSubmitted[] = "nothing was submitted";
bool SaysNothingSubmitted(const absl::Status& status);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_RPC_STATUS_H_
