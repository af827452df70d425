// A gRPC request taken as bytes (a raw callback method) and parsed by the
// method itself, after the caller's credential passed and the bytes fit the
// method's bound. gRPC parses a typed method's request before the method
// runs: a request of 4 MiB of empty repeated or unknown fields grew 16 to
// 30 times in memory (a message object or an UnknownField a few bytes of
// wire each) before a stranger was refused, on up to
// kMaxStreamsPerConnection streams of every connection
// (grpc_server_limits.h). Taken as bytes, it costs its bytes.
//
// Thread-safe (pure).
#ifndef PIPETRAIN_COMMON_RAW_REQUEST_H_
#define PIPETRAIN_COMMON_RAW_REQUEST_H_

#include <grpcpp/impl/codegen/proto_utils.h>  // SerializationTraits of protobuf messages
#include <grpcpp/support/byte_buffer.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// RESOURCE_EXHAUSTED "METHOD: a request of N bytes is over this method's
// limit of M bytes" when `bytes` > `max_bytes`.
absl::Status CheckRequestBytes(absl::string_view method, size_t bytes, size_t max_bytes);

// `raw` parsed into `request` (`raw` itself is left as it was);
// INVALID_ARGUMENT "METHOD: the request is not a pipetrain.v1.TYPE" when
// it is none (broken wire format, a string that is not UTF-8).
template <typename Request>
absl::Status ParseRequest(absl::string_view method, const grpc::ByteBuffer& raw, Request* request) {
  grpc::ByteBuffer consumed(raw);  // Deserialize empties its buffer; this shares the bytes
  if (!grpc::SerializationTraits<Request>::Deserialize(&consumed, request).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": the request is not a ", Request::descriptor()->full_name()));
  }
  return absl::OkStatus();
}

// `answer` serialized into `raw`; INTERNAL when it cannot be (over 2 GiB).
template <typename Answer>
absl::Status SerializeAnswer(const Answer& answer, grpc::ByteBuffer* raw) {
  bool own_buffer = false;
  if (!grpc::SerializationTraits<Answer>::Serialize(answer, raw, &own_buffer).ok()) {
    return absl::InternalError(absl::StrCat("the answer, a ", Answer::descriptor()->full_name(),
                                            " of ", answer.ByteSizeLong(),
                                            " bytes, could not be serialized"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_RAW_REQUEST_H_
