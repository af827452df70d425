// Frame codec: a WireTensor on the data plane travels as TensorFrames
// (proto/pipetrain/v1/dataplane.proto), each carrying the full header and at
// most `max_frame_bytes` of payload, in order on one stream.
//
//   EncodeTensorFrames   WireTensor + address + source stage -> frames
//   FrameAssembler       frames of one stream -> complete WireTensors
//
// The header's dtype is always "f32" (what the tensor is, decoded) and its
// shape the decoded shape. Its codec says what the bytes are:
//   "raw"        little-endian fp32, row-major; total_bytes = numel * 4.
//   a codec spec (kernels/compress/codec_spec.h, e.g. "piecewise:bits=3"):
//                the codec's self-describing payload; total_bytes = its size.
// Encoded payloads travel as opaque bytes: decoding is the runtime's job
// (DecodeWireTensor in transport.h), not the transport's.
//
// This file is pure logic (no gRPC), so the server and the tests share it.
#ifndef PIPETRAIN_WORKER_TRANSPORT_FRAME_CODEC_H_
#define PIPETRAIN_WORKER_TRANSPORT_FRAME_CODEC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data_plane_limits.h"
#include "common/tensor.h"
#include "proto/pipetrain/v1/dataplane.pb.h"
#include "worker/transport/frame_wire.h"
#include "worker/transport/mailbox.h"
#include "worker/transport/transport.h"

namespace pipetrain {

inline constexpr char kDtypeF32[] = "f32";
inline constexpr char kCodecRaw[] = "raw";

// Largest payload per frame (DESIGN.md §6) and the gRPC message limit that
// leaves room for the header on top of it; both ends configure gRPC with it.
inline constexpr int64_t kMaxFramePayloadBytes = int64_t{4} << 20;
inline constexpr int kMaxFrameMessageBytes = 8 << 20;

// The most dimensions a frame's shape may have (as kMaxPayloadRank for an
// encoded payload); a receiver refuses more before it reads them.
inline constexpr int kMaxFrameRank = 8;

// A receiver refuses tensors larger than this before allocating them, so a
// corrupt header cannot make it allocate terabytes. GPT-2 XL activations of a
// large micro-batch are well below it. The planner keeps its sends within the
// same shared limit (common/data_plane_limits.h).
inline constexpr int64_t kDefaultMaxTensorBytes = kMaxDataPlaneTensorBytes;

// Splits the bytes of `wire` (a raw tensor's data, or an encoded payload)
// into frames of at most `max_frame_bytes` (an empty raw tensor gives one
// frame with an empty payload). Copies the bytes: the caller may change
// `wire` afterwards. Requires a non-null tensor if raw, a non-empty payload
// if encoded (see CheckSendable), and 1 <= max_frame_bytes <=
// kMaxFramePayloadBytes (all checked).
std::vector<v1::TensorFrame> EncodeTensorFrames(int source_stage, const TensorAddress& address,
                                                const WireTensor& wire,
                                                int64_t max_frame_bytes = kMaxFramePayloadBytes);

// The frames' headers (payload empty, offset set) for the same split as
// EncodeTensorFrames, and where their bytes come from: frame i carries
// [offset, offset + size) of WireBytes(wire), with size =
// FramePayloadBytes(headers, i). Same requirements as EncodeTensorFrames.
std::vector<v1::TensorFrame> EncodeFrameHeaders(int source_stage, const TensorAddress& address,
                                                const WireTensor& wire,
                                                int64_t max_frame_bytes = kMaxFramePayloadBytes);
int64_t FramePayloadBytes(const std::vector<v1::TensorFrame>& headers, size_t i);
const char* WireBytes(const WireTensor& wire);

// Whether `wire` can be framed and would pass a receiver's header checks:
// INVALID_ARGUMENT naming `what` for a null raw tensor, for one of more than
// kMaxFrameRank dimensions, or for an encoded one whose codec is not a valid
// codec spec, whose payload is empty or whose shape has a negative
// dimension. Size limits are the receiver's to check.
absl::Status CheckSendable(const WireTensor& wire, const std::string& what);

// The job a receiver currently accepts frames for. An empty job_id accepts
// nothing (the worker has no assignment).
struct AcceptedJob {
  std::string job_id;
  int num_stages = 0;
  // This worker's data-plane receive key (data_plane_auth.h); the
  // receiver's stream check uses it, the assembler does not.
  std::string receive_key;
};

struct ReceivedTensor {
  int source_stage = 0;
  TensorAddress address;
  WireTensor wire;  // As sent: raw, or encoded with the frame's codec.
  // What the Admission reserved for it (none without one): pass it to
  // Mailbox::Put with `wire`, or drop it to give the bytes back.
  Mailbox::Reservation reservation;
};

// The longest error text a FrameError carries (MakeFrameError cuts it).
inline constexpr size_t kMaxFrameErrorBytes = 4096;

// The FrameError a receiver writes back for a frame it rejected.
v1::FrameError MakeFrameError(const v1::TensorFrame& frame, const absl::Status& status);

// Reassembles the frames of one stream. Frames of one tensor arrive in order
// and are not interleaved with another tensor's frames; different streams
// need different assemblers.
//
// Every rejected frame is INVALID_ARGUMENT naming the tensor, its source
// stage and the problem (strings the peer sent are quoted by their first 64
// bytes, escaped): dtype not "f32"; codec neither "raw" nor a codec
// spec ParseCodecSpec accepts (the message quotes it); more than
// kMaxFrameRank dimensions; a negative dimension;
// a decoded size (numel * 4) over the size limit; for raw, total_bytes !=
// numel * 4; for encoded, total_bytes < 1 (a payload always has a header) or
// over the size limit; an offset other than the bytes received so far;
// payload past total_bytes; a frame's payload over kMaxFramePayloadBytes;
// a header (codec, shape, total_bytes) that changes
// within a tensor; a frame of another tensor while one is incomplete; kind
// unspecified or unknown; source stage outside [0, num_stages); a job other
// than the accepted one. A rejection drops the incomplete tensor; the
// remaining frames of the rejected tensor (same source and address,
// offset > 0) are then dropped silently, so one bad tensor costs one error
// (and two interleaved tensors cost one: the interrupted one's rest is
// dropped too).
//
// Not thread-safe: one stream's frames are handled one at a time.
class FrameAssembler {
 public:
  // Where raw tensors' memory comes from (contents may be left
  // unspecified: the assembler writes every byte before handing a tensor
  // on); null: Tensor::Uninitialized.
  using Allocator = std::function<Tensor(const Shape&)>;

  explicit FrameAssembler(int64_t max_tensor_bytes = kDefaultMaxTensorBytes,
                          Allocator allocate = nullptr)
      : max_tensor_bytes_(max_tensor_bytes), allocate_(std::move(allocate)) {}

  // Asked before the first frame of a tensor is buffered: (address, its
  // total_bytes) -> the bytes reserved for it (e.g. Mailbox::Reserve) to
  // take it, or the error to reject it with (which drops the tensor's
  // remaining frames as any rejection does). The assembler holds the
  // reservation while the tensor is incomplete and hands it on in the
  // ReceivedTensor; it is given back when the tensor is abandoned instead
  // (a rejected frame, or the assembler destroyed), so tensors being
  // assembled on several streams count against one limit together.
  using Admission =
      std::function<absl::StatusOr<Mailbox::Reservation>(const TensorAddress&, int64_t)>;

  // Returns the tensor `frame` completes, nullopt while more frames are due
  // (or the frame was silently dropped, see above), INVALID_ARGUMENT when
  // the frame is rejected, or `admit`'s error for a tensor it refuses.
  absl::StatusOr<std::optional<ReceivedTensor>> Accept(const FrameView& frame,
                                                       const AcceptedJob& job,
                                                       const Admission& admit = nullptr);
  // The same for a frame parsed by protobuf (tests, the fuzzer).
  absl::StatusOr<std::optional<ReceivedTensor>> Accept(const v1::TensorFrame& frame,
                                                       const AcceptedJob& job,
                                                       const Admission& admit = nullptr);

  // True between the first and the last frame of a tensor (and only then
  // does the assembler hold a reservation).
  bool in_progress() const { return partial_.has_value(); }
  // Drops the incomplete tensor, if any, and gives back its reservation
  // now, for a stream that ends without reading further (a job change).
  // Later frames of the tensor are rejected (offset past 0 of no tensor).
  void Abandon() {
    partial_.reset();
    interrupted_.reset();
  }
  // After the last Accept rejected a frame: the incomplete tensor (its
  // source stage and address) that frame interrupted and so dropped, whose
  // receiver should hear of it as of the rejected one; empty otherwise.
  std::optional<std::pair<int, TensorAddress>> interrupted() const { return interrupted_; }

 private:
  // Which tensor a frame belongs to.
  struct Identity {
    int source_stage = 0;
    TensorAddress address;
    bool operator==(const Identity& o) const {
      return source_stage == o.source_stage && address == o.address;
    }
  };
  struct Partial {
    Identity id;
    std::string codec;  // The frame's codec: "raw" or a codec spec.
    Shape shape;
    int64_t total_bytes = 0;
    int64_t received = 0;
    Tensor tensor;        // Raw: filled in place.
    std::string payload;  // Encoded: appended to.
    // The Admission's, for total_bytes; given back with the Partial.
    Mailbox::Reservation reservation;
  };

  // `frame`'s own payload field is ignored: the payload is `payload`, of
  // `payload_bytes` in all.
  absl::StatusOr<std::optional<ReceivedTensor>> AcceptPieces(
      const v1::TensorFrame& frame, absl::Span<const absl::string_view> payload,
      int64_t payload_bytes, const AcceptedJob& job, const Admission& admit);
  absl::Status CheckAgainstPartial(const v1::TensorFrame& frame, const Identity& id) const;
  void StartTensor(const v1::TensorFrame& frame, const Identity& id,
                   Mailbox::Reservation reservation);
  void AppendPayload(const v1::TensorFrame& frame, absl::Span<const absl::string_view> payload,
                     int64_t payload_bytes);

  int64_t max_tensor_bytes_;
  Allocator allocate_;
  std::optional<Partial> partial_;
  // The tensors whose remaining frames are dropped silently: the rejected
  // one, and the incomplete one it interrupted (frames of two tensors
  // interleaved: each would cost an error per frame otherwise).
  std::vector<Identity> discarding_;
  std::optional<std::pair<int, TensorAddress>> interrupted_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_FRAME_CODEC_H_
