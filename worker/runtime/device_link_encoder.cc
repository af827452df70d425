#include "worker/runtime/device_link_encoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// The device codecs carry finite values only (as the host's). When `x`
// holds a NaN or an infinity the training diverged (an infinite gradient
// broke the weights while its step's loss was still finite): said so in
// the host path's words (LinkCompressor::Encode), not as a codec's fault.
// `refused` otherwise. Only for a refusal (INVALID_ARGUMENT): after a
// device error (INTERNAL) the tensor cannot be read back.
absl::Status NameDivergence(Backend* backend, const v1::Instruction::Send& send, const Tensor& x,
                            const absl::Status& refused) {
  if (refused.code() != absl::StatusCode::kInvalidArgument) return refused;
  const Tensor host = x.on_device() ? backend->Download(x) : Tensor();
  // A device that failed meanwhile (another stream's error) downloads NaN:
  // that is its fault, not the training's.
  if (x.on_device() && !backend->status().ok()) return refused;
  const std::string bad = DescribeFirstNonFinite(x.on_device() ? host : x);
  if (bad.empty()) return refused;
  return absl::FailedPreconditionError(absl::StrCat(
      "training diverged: encoding as ", send.codec(), " on the device: the tensor ", bad,
      " (the weights or an input of this step are no longer finite); try a lower learning "
      "rate, a warm-up or gradient clipping"));
}

}  // namespace

void DeviceLinkEncoder::BeginIteration() {
  for (auto& [key, link] : links_) link.residual = Tensor();
}

std::map<DeviceLinkEncoder::LinkKey, Tensor> DeviceLinkEncoder::WarmStarts() const {
  std::map<LinkKey, Tensor> out;
  for (const auto& [key, link] : links_) {
    const Tensor& q = link.codec.powersgd_q;
    if (link.path != Path::kDevice || q.is_null()) continue;
    out[key] = q.on_device() ? backend_->Download(q) : q.Clone();
  }
  return out;
}

void DeviceLinkEncoder::SetWarmStart(const LinkKey& link, const Tensor& q) {
  links_[link].codec.powersgd_q = backend_->Upload(q);
}

absl::StatusOr<std::string> DeviceLinkEncoder::Encode(const v1::Instruction::Send& send,
                                                      const Tensor& x,
                                                      absl::Span<const float> scores) {
  const LinkKey key{send.peer_stage(), send.tensor().kind(), send.tensor().unit()};
  LinkState& link = links_[key];
  if (link.path == Path::kHost) return absl::UnimplementedError("this link encodes on the host");
  absl::StatusOr<std::string> payload =
      send.error_feedback() ? EncodeWithFeedback(send, x, &link)
                            : backend_->EncodeOnDevice(x, send.codec(), scores, &link.codec);
  if (payload.ok()) {
    link.path = Path::kDevice;
    return payload;
  }
  link.residual = Tensor();
  if (payload.status().code() == absl::StatusCode::kUnimplemented) {
    if (link.path == Path::kUndecided) {
      link.path = Path::kHost;
      return payload;
    }
    // The backend's answer depends on the codec, the tensor's place and its
    // emptiness, all fixed per link: a change is a bug, not a fallback.
    return absl::InternalError(
        absl::StrCat("the device codec of a link stopped answering: ", payload.status().message()));
  }
  return NameDivergence(backend_, send, x, payload.status());
}

// error_feedback.h's Compress on the device, with the flush rule of
// LinkCompressor::EncodeWithFeedback. y is x itself when no residual is held
// (x is never written) and the residual otherwise (x added into it, the
// same fp32 sums as the host's x + residual).
absl::StatusOr<std::string> DeviceLinkEncoder::EncodeWithFeedback(
    const v1::Instruction::Send& send, const Tensor& x, LinkState* link) {
  Tensor y = x;
  if (!link->residual.is_null()) {
    if (link->residual.shape() != x.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "error feedback: tensor ", ShapeToString(x.shape()), " does not match the link's residual ",
          ShapeToString(link->residual.shape())));
    }
    backend_->AddInPlace(link->residual.data(), x.data(), x.numel());
    y = std::move(link->residual);
    link->residual = Tensor();
  }
  ASSIGN_OR_RETURN(std::string payload,
                   backend_->EncodeOnDevice(y, send.codec(), /*scores=*/{}, &link->codec));
  if (send.flush_residual()) return payload;  // the iteration ends with no residual
  ASSIGN_OR_RETURN(Tensor decoded, backend_->DecodeOnDevice(send.codec(), payload, y.shape()));
  // residual = y - decoded, written over decoded (a tensor of our own).
  backend_->Subtract(y.data(), decoded.data(), y.numel(), decoded.data());
  RETURN_IF_ERROR(backend_->status());
  link->residual = std::move(decoded);
  return payload;
}

}  // namespace pipetrain
