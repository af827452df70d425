#include "worker/transport/transport.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/status_macros.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/payload.h"

namespace pipetrain {

std::string TensorAddress::DebugString() const {
  return absl::StrCat(EnumShortName(kind), " of unit ", unit, ", micro-batch ", micro_batch,
                      ", iteration ", iteration, " (job ", job_id, ")");
}

bool TensorAddress::operator<(const TensorAddress& o) const {
  return std::tie(job_id, iteration, kind, micro_batch, unit) <
         std::tie(o.job_id, o.iteration, o.kind, o.micro_batch, o.unit);
}

bool TensorAddress::operator==(const TensorAddress& o) const {
  return std::tie(job_id, iteration, kind, micro_batch, unit) ==
         std::tie(o.job_id, o.iteration, o.kind, o.micro_batch, o.unit);
}

TensorAddress MakeAddress(const std::string& job_id, int64_t iteration,
                          const v1::TensorKey& key) {
  return {job_id, iteration, key.kind(), key.micro_batch(), key.unit()};
}

WireTensor WireTensor::Raw(Tensor t) {
  WireTensor w;
  w.tensor = std::move(t);
  return w;
}

WireTensor WireTensor::Encoded(std::string codec, std::string payload, Shape shape) {
  WireTensor w;
  w.codec = std::move(codec);
  w.payload = std::move(payload);
  w.shape = std::move(shape);
  return w;
}

const Shape& WireTensor::decoded_shape() const { return encoded() ? shape : tensor.shape(); }

int64_t WireTensor::wire_bytes() const {
  return encoded() ? static_cast<int64_t>(payload.size()) : tensor.size_bytes();
}

int64_t WireTensor::raw_bytes() const {
  return NumElements(decoded_shape()) * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<Tensor> DecodeWireTensor(const WireTensor& wire, const std::string& what) {
  if (!wire.encoded()) return wire.tensor;
  auto codec = MakeCodec(wire.codec);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": codec \"", wire.codec, "\": ", codec.status().message()));
  }
  return DecodeWireTensorWith(**codec, wire, what);
}

absl::StatusOr<Tensor> DecodeWireTensorWith(const Codec& codec, const WireTensor& wire,
                                            const std::string& what) {
  // The shape the payload announces is checked before Decode allocates it:
  // wire.shape is within the receiver's size limit (FrameAssembler), the
  // payload's header is not, and a few bytes of a sparse or low-rank
  // payload can announce terabytes.
  absl::StatusOr<Shape> announced = PeekPayloadShape(wire.payload);
  if (!announced.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot decode its ", wire.codec,
                                                   " payload: ", announced.status().message()));
  }
  if (*announced != wire.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", wire.codec, " payload announces shape ", ShapeToString(*announced),
                     " but was sent as ", ShapeToString(wire.shape), "; not decoded"));
  }
  auto decoded = codec.Decode(wire.payload);
  if (!decoded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot decode its ", wire.codec,
                                                   " payload: ", decoded.status().message()));
  }
  if (decoded->shape() != wire.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", wire.codec, " payload decodes to shape ", ShapeToString(decoded->shape()),
        " but was sent as ", ShapeToString(wire.shape)));
  }
  return *std::move(decoded);
}

absl::Status WithOwnQueuedSends(absl::Status timed_out, int peer_stage, int64_t queued_bytes,
                                absl::string_view where) {
  if (queued_bytes <= 0 || !absl::IsDeadlineExceeded(timed_out)) return timed_out;
  return absl::DeadlineExceededError(
      absl::StrCat(timed_out.message(), "; this worker's own sends to stage ", peer_stage,
                   " still have ", queued_bytes, " bytes waiting ", where,
                   ", so the slow side may be this worker's link rather than that stage"));
}

absl::Status Transport::Send(int peer_stage, const TensorAddress& address, const Tensor& tensor) {
  return SendWire(peer_stage, address, WireTensor::Raw(tensor));
}

absl::Status Transport::SendOwned(int peer_stage, const TensorAddress& address, Tensor tensor) {
  return SendWireOwned(peer_stage, address, WireTensor::Raw(std::move(tensor)));
}

absl::StatusOr<Tensor> Transport::Recv(int peer_stage, const TensorAddress& address,
                                       absl::Duration timeout) {
  ASSIGN_OR_RETURN(WireTensor wire, RecvWire(peer_stage, address, timeout));
  return DecodeWireTensor(wire, absl::StrCat(address.DebugString(), " from stage ", peer_stage));
}

}  // namespace pipetrain
