#include "worker/transport/frame_codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/utf8_prefix.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

constexpr int64_t kBytesPerElement = static_cast<int64_t>(sizeof(float));

TensorAddress AddressOf(const v1::TensorFrame& frame) {
  return MakeAddress(frame.job_id(), frame.iteration(), frame.tensor());
}

// A string a peer sent, as an error message quotes it: its first 64
// bytes, escaped, and its size if there is more. Header strings are
// bounded only by the message size (8 MiB), and rejections are logged
// and written back to the peer.
std::string PeerText(absl::string_view text) {
  constexpr size_t kShown = 64;
  std::string out = absl::CHexEscape(text.substr(0, kShown));
  if (text.size() > kShown) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

// "ACTIVATION of unit 3, micro-batch 1, iteration 7 (job j-1) from stage 0";
// spells out kinds this build does not know instead of printing "".
std::string Describe(const v1::TensorFrame& frame) {
  const v1::TensorKey& key = frame.tensor();
  const std::string job = PeerText(frame.job_id());
  std::string tensor =
      v1::TensorKind_IsValid(key.kind())
          ? MakeAddress(job, frame.iteration(), frame.tensor()).DebugString()
          : absl::StrCat("tensor kind ", key.kind(), " of unit ", key.unit(), ", micro-batch ",
                         key.micro_batch(), ", iteration ", frame.iteration(), " (job ", job, ")");
  return absl::StrCat(tensor, " from stage ", frame.source_stage());
}

absl::Status Invalid(const v1::TensorFrame& frame, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("frame of ", Describe(frame), ": ", problem));
}

Shape ShapeOf(const v1::TensorFrame& frame) {
  return Shape(frame.shape().begin(), frame.shape().end());
}

// Is the frame meant for this worker's current job, from a stage it has?
absl::Status CheckRouting(const v1::TensorFrame& frame, const AcceptedJob& job) {
  const int kind = frame.tensor().kind();
  if (kind == v1::TENSOR_KIND_UNSPECIFIED) {
    return Invalid(frame, "tensor kind is TENSOR_KIND_UNSPECIFIED; the sender must set it");
  }
  if (!v1::TensorKind_IsValid(kind)) {
    return Invalid(frame, absl::StrCat("tensor kind ", kind,
                                       " is unknown to this worker; are both workers the same "
                                       "version?"));
  }
  if (job.job_id.empty()) {
    return Invalid(
        frame, absl::StrCat("this worker has no job assigned, so job \"", PeerText(frame.job_id()),
                            "\" is not accepted; check the coordinator's assignments"));
  }
  if (frame.job_id() != job.job_id) {
    return Invalid(
        frame, absl::StrCat("wrong job \"", PeerText(frame.job_id()), "\"; this worker runs job \"",
                            job.job_id, "\", so the sender's plan is stale"));
  }
  if (frame.source_stage() < 0 || frame.source_stage() >= job.num_stages) {
    return Invalid(frame, absl::StrCat("source stage ", frame.source_stage(), " is outside [0, ",
                                       job.num_stages, ") for job ", job.job_id));
  }
  // Iterations count from 0: a tensor of a negative one would wait in the
  // mailbox, behind the run-ahead window, until the job ends.
  if (frame.iteration() < 0) {
    return Invalid(frame, absl::StrCat("iteration ", frame.iteration(), " is negative"));
  }
  return absl::OkStatus();
}

// The decoded size in bytes of the header's f32 shape, if it has no negative
// dimension and is within `max_tensor_bytes` (checked without overflow).
absl::StatusOr<int64_t> DecodedBytes(const v1::TensorFrame& frame, int64_t max_tensor_bytes) {
  if (frame.shape_size() > kMaxFrameRank) {
    return Invalid(frame, absl::StrCat("shape of ", frame.shape_size(), " dimensions; at most ",
                                       kMaxFrameRank));
  }
  const Shape shape = ShapeOf(frame);
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    return Invalid(frame,
                   absl::StrCat("shape ", ShapeToString(shape), " has a negative dimension"));
  }
  // The nonzero dims must fit the limit even when a 0 makes the tensor
  // empty: [2^62, 4, 0] would overflow int64 in NumElements before its 0.
  const int64_t max_elements = max_tensor_bytes / kBytesPerElement;
  int64_t nonzero_numel = 1;
  for (int64_t d : shape) {
    if (d == 0) continue;
    if (nonzero_numel > max_elements / d) {
      return Invalid(
          frame, absl::StrCat("shape ", ShapeToString(shape), " is over the data-plane limit of ",
                              max_tensor_bytes, " bytes per tensor"));
    }
    nonzero_numel *= d;
  }
  if (std::count(shape.begin(), shape.end(), int64_t{0}) > 0) return 0;
  return nonzero_numel * kBytesPerElement;
}

// An encoded tensor's payload size: at least its header, at most the limit.
absl::Status CheckEncoded(const v1::TensorFrame& frame, int64_t max_tensor_bytes) {
  absl::StatusOr<std::vector<CodecStage>> spec = ParseCodecSpec(frame.codec());
  if (!spec.ok()) {
    return Invalid(
        frame,
        absl::StrCat("codec \"", PeerText(frame.codec()), "\" is not supported: it is neither \"",
                     kCodecRaw, "\" nor a codec spec this worker knows (", spec.status().message(),
                     "); are both workers the same version?"));
  }
  if (frame.total_bytes() < 1) {
    return Invalid(frame, absl::StrCat("total_bytes ", frame.total_bytes(), " of a ", frame.codec(),
                                       " payload is below 1; a payload always has a header"));
  }
  if (frame.total_bytes() > max_tensor_bytes) {
    return Invalid(frame, absl::StrCat("total_bytes ", frame.total_bytes(), " of a ", frame.codec(),
                                       " payload is over the data-plane limit of ",
                                       max_tensor_bytes, " bytes per tensor"));
  }
  return absl::OkStatus();
}

// Does the header describe an f32 tensor, raw or encoded, of a size we accept?
absl::Status CheckLayout(const v1::TensorFrame& frame, int64_t max_tensor_bytes) {
  if (frame.dtype() != kDtypeF32) {
    return Invalid(frame, absl::StrCat("dtype \"", PeerText(frame.dtype()),
                                       "\" is not supported; only \"", kDtypeF32, "\" is"));
  }
  absl::StatusOr<int64_t> bytes = DecodedBytes(frame, max_tensor_bytes);
  if (!bytes.ok()) return bytes.status();
  if (frame.codec() != kCodecRaw) return CheckEncoded(frame, max_tensor_bytes);
  if (frame.total_bytes() != *bytes) {
    return Invalid(frame,
                   absl::StrCat("total_bytes ", frame.total_bytes(), " does not match shape ",
                                ShapeToString(ShapeOf(frame)), " of f32 (", *bytes, " bytes)"));
  }
  return absl::OkStatus();
}

// Is the payload (`size` bytes) the next piece of the tensor, inside it,
// and at most kMaxFramePayloadBytes (the documented bound; the gRPC message
// limit alone would let a peer send twice that in one frame)?
absl::Status CheckRange(const v1::TensorFrame& frame, int64_t size, int64_t received) {
  if (size > kMaxFramePayloadBytes) {
    return Invalid(frame, absl::StrCat("payload of ", size, " bytes is over the ",
                                       kMaxFramePayloadBytes, " a frame may carry"));
  }
  if (frame.offset() != received) {
    return Invalid(frame, absl::StrCat("frame offset ", frame.offset(), " is not the ", received,
                                       " bytes received so far; a frame was lost, reordered or "
                                       "rejected"));
  }
  if (size > frame.total_bytes() - frame.offset()) {
    return Invalid(frame, absl::StrCat("payload of ", size, " bytes at offset ", frame.offset(),
                                       " runs past total_bytes ", frame.total_bytes()));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<v1::TensorFrame> EncodeFrameHeaders(int source_stage, const TensorAddress& address,
                                                const WireTensor& wire, int64_t max_frame_bytes) {
  PT_CHECK(wire.encoded() || !wire.tensor.is_null()) << "null tensor for " << address.DebugString();
  PT_CHECK(!wire.encoded() || !wire.payload.empty())
      << "empty " << wire.codec << " payload for " << address.DebugString();
  PT_CHECK(max_frame_bytes >= 1 && max_frame_bytes <= kMaxFramePayloadBytes)
      << "max_frame_bytes " << max_frame_bytes;
  v1::TensorFrame header;
  header.set_job_id(address.job_id);
  header.set_iteration(address.iteration);
  header.mutable_tensor()->set_kind(address.kind);
  header.mutable_tensor()->set_micro_batch(address.micro_batch);
  header.mutable_tensor()->set_unit(address.unit);
  header.set_source_stage(source_stage);
  header.set_dtype(kDtypeF32);
  header.set_codec(wire.encoded() ? wire.codec : kCodecRaw);
  for (int64_t d : wire.decoded_shape()) header.add_shape(d);
  const int64_t total = wire.wire_bytes();
  header.set_total_bytes(total);

  std::vector<v1::TensorFrame> headers;
  headers.reserve(std::max<int64_t>(1, (total + max_frame_bytes - 1) / max_frame_bytes));
  int64_t offset = 0;
  do {  // An empty tensor still needs one frame to announce it.
    headers.push_back(header);
    headers.back().set_offset(offset);
    offset += std::min(max_frame_bytes, total - offset);
  } while (offset < total);
  return headers;
}

int64_t FramePayloadBytes(const std::vector<v1::TensorFrame>& headers, size_t i) {
  const int64_t end = i + 1 < headers.size() ? headers[i + 1].offset() : headers[i].total_bytes();
  return end - headers[i].offset();
}

const char* WireBytes(const WireTensor& wire) {
  return wire.encoded() ? wire.payload.data() : reinterpret_cast<const char*>(wire.tensor.data());
}

std::vector<v1::TensorFrame> EncodeTensorFrames(int source_stage, const TensorAddress& address,
                                                const WireTensor& wire, int64_t max_frame_bytes) {
  std::vector<v1::TensorFrame> frames =
      EncodeFrameHeaders(source_stage, address, wire, max_frame_bytes);
  const char* bytes = WireBytes(wire);
  for (size_t i = 0; i < frames.size(); ++i) {
    frames[i].set_payload(bytes + frames[i].offset(),
                          static_cast<size_t>(FramePayloadBytes(frames, i)));
  }
  return frames;
}

absl::Status CheckSendable(const WireTensor& wire, const std::string& what) {
  // The receiver refuses a frame of more dimensions (frame_wire.h) after
  // the whole tensor was sent: refused here, with the sender's words.
  const auto check_rank = [&what](const Shape& shape) {
    if (static_cast<int>(shape.size()) <= kMaxFrameRank) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape ", ShapeToString(shape), " has ", shape.size(),
                     " dimensions; a frame carries at most ", kMaxFrameRank));
  };
  if (!wire.encoded()) {
    if (!wire.tensor.is_null()) return check_rank(wire.tensor.shape());
    return absl::InvalidArgumentError(absl::StrCat("null tensor for ", what));
  }
  if (absl::Status rank = check_rank(wire.shape); !rank.ok()) return rank;
  absl::StatusOr<std::vector<CodecStage>> spec = ParseCodecSpec(wire.codec);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": codec \"", wire.codec, "\" is not a codec spec: ", spec.status().message()));
  }
  if (wire.payload.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": empty ", wire.codec, " payload; an encoded tensor has a header"));
  }
  const Shape& shape = wire.shape;
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape ", ShapeToString(shape), " has a negative dimension"));
  }
  return absl::OkStatus();
}

v1::FrameError MakeFrameError(const v1::TensorFrame& frame, const absl::Status& status) {
  v1::FrameError error;
  *error.mutable_tensor() = frame.tensor();
  error.set_iteration(frame.iteration());
  // Quotes of the peer's strings are short (PeerText); the cap keeps every
  // queued reply small whatever a message says.
  // At a character's start: a proto3 string must stay valid UTF-8, or the
  // sender could not parse the reply.
  const std::string text = status.ToString();
  error.set_error(std::string(Utf8Prefix(text, kMaxFrameErrorBytes)));
  error.set_code(static_cast<int32_t>(status.code()));
  return error;
}

absl::Status FrameAssembler::CheckAgainstPartial(const v1::TensorFrame& frame,
                                                 const Identity& id) const {
  const Partial& p = *partial_;
  if (!(id == p.id)) {
    return Invalid(frame, absl::StrCat("it arrived while ", p.id.address.DebugString(),
                                       " from stage ", p.id.source_stage, " is incomplete (",
                                       p.received, " of ", p.total_bytes,
                                       " bytes); frames of different tensors must not interleave "
                                       "on one stream"));
  }
  if (frame.codec() != p.codec || ShapeOf(frame) != p.shape ||
      frame.total_bytes() != p.total_bytes) {
    return Invalid(frame,
                   absl::StrCat("header changed within the tensor: codec ", PeerText(frame.codec()),
                                ", shape ", ShapeToString(ShapeOf(frame)), ", total_bytes ",
                                frame.total_bytes(), " after codec ", p.codec, ", shape ",
                                ShapeToString(p.shape), ", total_bytes ", p.total_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ReceivedTensor>> FrameAssembler::Accept(const FrameView& frame,
                                                                     const AcceptedJob& job,
                                                                     const Admission& admit) {
  return AcceptPieces(frame.header, frame.payload, frame.payload_bytes, job, admit);
}

absl::StatusOr<std::optional<ReceivedTensor>> FrameAssembler::Accept(const v1::TensorFrame& frame,
                                                                     const AcceptedJob& job,
                                                                     const Admission& admit) {
  const absl::string_view payload = frame.payload();
  return AcceptPieces(frame, absl::MakeConstSpan(&payload, 1), static_cast<int64_t>(payload.size()),
                      job, admit);
}

absl::StatusOr<std::optional<ReceivedTensor>> FrameAssembler::AcceptPieces(
    const v1::TensorFrame& frame, absl::Span<const absl::string_view> payload,
    int64_t payload_bytes, const AcceptedJob& job, const Admission& admit) {
  const Identity id{frame.source_stage(), AddressOf(frame)};
  if (!partial_.has_value() && frame.offset() > 0 &&
      std::find(discarding_.begin(), discarding_.end(), id) != discarding_.end()) {
    return std::nullopt;  // The rest of a tensor already rejected with an error.
  }
  absl::Status status = CheckRouting(frame, job);
  if (status.ok()) status = CheckLayout(frame, max_tensor_bytes_);
  if (status.ok() && partial_.has_value()) status = CheckAgainstPartial(frame, id);
  if (status.ok()) {
    status = CheckRange(frame, payload_bytes, partial_.has_value() ? partial_->received : 0);
  }
  Mailbox::Reservation reservation;
  if (status.ok() && !partial_.has_value() && admit) {
    absl::StatusOr<Mailbox::Reservation> admitted = admit(id.address, frame.total_bytes());
    if (admitted.ok()) {
      reservation = *std::move(admitted);
    } else {
      status = admitted.status();
    }
  }
  if (!status.ok()) {
    discarding_ = {id};
    interrupted_.reset();
    if (partial_.has_value() && !(partial_->id == id)) {
      discarding_.push_back(partial_->id);
      interrupted_ = std::make_pair(partial_->id.source_stage, partial_->id.address);
    }
    partial_.reset();  // Gives back what was reserved for it.
    return status;
  }
  if (!partial_.has_value()) StartTensor(frame, id, std::move(reservation));
  AppendPayload(frame, payload, payload_bytes);
  if (partial_->received < partial_->total_bytes) return std::nullopt;

  Partial& p = *partial_;
  ReceivedTensor done{
      id.source_stage, id.address,
      p.codec == kCodecRaw
          ? WireTensor::Raw(std::move(p.tensor))
          : WireTensor::Encoded(std::move(p.codec), std::move(p.payload), std::move(p.shape)),
      std::move(p.reservation)};
  partial_.reset();
  return done;
}

void FrameAssembler::StartTensor(const v1::TensorFrame& frame, const Identity& id,
                                 Mailbox::Reservation reservation) {
  Partial p{id, frame.codec(), ShapeOf(frame), frame.total_bytes()};
  p.reservation = std::move(reservation);  // Taken before the memory below.
  if (p.codec == kCodecRaw) {
    // Every byte arrives before the tensor is handed on.
    p.tensor = allocate_ ? allocate_(p.shape) : Tensor::Uninitialized(p.shape);
  } else {
    p.payload.reserve(static_cast<size_t>(p.total_bytes));  // Checked against the limit.
  }
  partial_ = std::move(p);
  discarding_.clear();
}

// Requires a frame CheckRange accepted: it continues at `received`.
void FrameAssembler::AppendPayload(const v1::TensorFrame& frame,
                                   absl::Span<const absl::string_view> payload,
                                   int64_t payload_bytes) {
  Partial& p = *partial_;
  int64_t offset = frame.offset();
  for (absl::string_view piece : payload) {
    if (p.codec == kCodecRaw) {
      std::memcpy(reinterpret_cast<char*>(p.tensor.data()) + offset, piece.data(), piece.size());
    } else {
      p.payload.append(piece.data(), piece.size());
    }
    offset += static_cast<int64_t>(piece.size());
  }
  p.received += payload_bytes;
}

}  // namespace pipetrain
