// absl::Time <-> google.protobuf.Timestamp, for the protos' time fields.
// ToProtoTimestamp rounds down to the nanosecond and keeps nanos in
// [0, 1e9), as the Timestamp contract asks, for any time after 1970.
#ifndef PIPETRAIN_COMMON_PROTO_TIME_H_
#define PIPETRAIN_COMMON_PROTO_TIME_H_

#include <cstdint>

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace pipetrain {

inline google::protobuf::Timestamp ToProtoTimestamp(absl::Time time) {
  const int64_t seconds = absl::ToUnixSeconds(time);  // rounds down
  google::protobuf::Timestamp timestamp;
  timestamp.set_seconds(seconds);
  timestamp.set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(time - absl::FromUnixSeconds(seconds))));
  return timestamp;
}

inline absl::Time FromProtoTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PROTO_TIME_H_
