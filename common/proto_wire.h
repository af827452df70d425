// Protobuf wire format by hand, for the few messages of other projects that
// pipetrain speaks without their .proto files: Debian ships neither
// grpc/health/v1/health.proto, grpc/reflection/v1alpha/reflection.proto nor
// google/rpc/{status,error_details}.proto, only libraries built from them.
// Fields are written and read by their published numbers (see the users).
//
//   std::string bytes = WireString(1, "pipetrain.v1.CoordinatorService");
//   absl::StatusOr<WireFields> fields = ParseWireFields(response_bytes);
//   int64_t status = fields->Varint(1);
#ifndef PIPETRAIN_COMMON_PROTO_WIRE_H_
#define PIPETRAIN_COMMON_PROTO_WIRE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// One field, encoded: a length-delimited field (string, bytes, or an
// embedded message's encoding) or a varint field (int32, int64, bool, enum).
std::string WireString(int number, absl::string_view value);
std::string WireVarint(int number, uint64_t value);

// The fields of one message's encoding, by number, in order of appearance.
// Only varint and length-delimited values are kept (fixed32/64 are skipped).
struct WireFields {
  std::map<int, std::vector<uint64_t>> varints;
  std::map<int, std::vector<std::string>> strings;

  // The last value of field `number` (proto3: the last one wins), or the
  // default (0, "") when absent.
  uint64_t Varint(int number) const;
  std::string String(int number) const;
  // Every value of a repeated length-delimited field.
  std::vector<std::string> Strings(int number) const;
};

// INVALID_ARGUMENT when `bytes` is not a well-formed encoding (a truncated
// field, a group, an unknown wire type).
absl::StatusOr<WireFields> ParseWireFields(absl::string_view bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PROTO_WIRE_H_
