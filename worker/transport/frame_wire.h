// The bytes of one TensorFrame message on the data plane, written and read
// without copying its payload through protobuf.
//
// A frame message is an ordinary serialized pipetrain.v1.TensorFrame (so a
// plain protobuf peer can still read or write one): pipetrain's sender puts
// the header fields first and the payload (field 10) last, and its receiver
// accepts the fields in any order. Why not protobuf's own (de)serialization:
// for a 4 MiB frame it copies the payload twice on each side (into the
// message's string, then into gRPC's buffer; and back), which on loopback
// costs more than the network (docs/benchmarks.md, "Activation streaming").
//
//   sender:   EncodeFrameHeader(header, n) followed by n payload bytes taken
//             straight from the tensor into gRPC's buffer (one copy);
//   receiver: ParseFrame(the message's slices) -> the header and views of
//             the payload inside those slices, which FrameAssembler copies
//             once into the tensor.
//
// Pure logic (no gRPC): the transport, the server, the tests and the fuzzer
// share it.
#ifndef PIPETRAIN_WORKER_TRANSPORT_FRAME_WIRE_H_
#define PIPETRAIN_WORKER_TRANSPORT_FRAME_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/pipetrain/v1/dataplane.pb.h"

namespace pipetrain {

// A received frame: its header and its payload as views into the message's
// bytes (valid as long as those are).
struct FrameView {
  v1::TensorFrame header;                  // Every field but payload, which is empty.
  std::vector<absl::string_view> payload;  // In order; no empty pieces.
  int64_t payload_bytes = 0;               // Their total size.
};

// The most bytes a frame's header fields (all but the payload) may take
// together: pipetrain's own take under 1 KiB (ids, a codec spec, a shape of
// at most kMaxFrameRank dimensions). Bounded before protobuf parses them,
// since a packed shape of 8 MiB of one-byte entries would parse into 64 MiB.
inline constexpr size_t kMaxFrameHeaderBytes = 64 << 10;

// The serialized header fields of `header` (its payload must be empty:
// checked) followed by the tag and length of a payload of `payload_bytes`
// (>= 0). Appending exactly that many bytes gives a valid TensorFrame.
std::string EncodeFrameHeader(const v1::TensorFrame& header, int64_t payload_bytes);

// Splits one serialized TensorFrame, given as the consecutive `pieces` of
// its bytes (gRPC's slices), into header and payload without copying the
// payload. Errors, all INVALID_ARGUMENT starting "malformed data-plane
// frame": a truncated or over-long varint, a field running past the end, a
// group or reserved wire type, field number 0, a payload field that is not
// length-delimited or appears twice, header fields over kMaxFrameHeaderBytes
// (refused before protobuf parses them), or header fields protobuf cannot
// parse.
// Requires nothing of the input: it is what a peer sent (fuzzed by
// //fuzz:frame_fuzzer).
absl::StatusOr<FrameView> ParseFrame(absl::Span<const absl::string_view> pieces);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_FRAME_WIRE_H_
