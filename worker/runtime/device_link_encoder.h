// DeviceLinkEncoder: the device half of a stage's send compression
// (DESIGN.md §6). Where the backend has a device twin of a send's codec
// (Backend::EncodeOnDevice: the CUDA backend for linear, piecewise,
// token_topk, powersgd, fp16 and bf16), the send is encoded where its tensor lives and
// only the payload crosses to the host. It keeps per link what
// LinkCompressor (link_compressor.h) keeps for the host path, on the device:
//  - the codec state (PowerSGD's warm-started Q), across iterations;
//  - for error-feedback sends, the residual, Optimus-CC §5.1 lazy error
//    propagation exactly as kernels/compress/error_feedback.h computes it:
//      y = x + residual;  payload = Encode(y);  residual = y - Decode(payload)
//    and LinkCompressor's end-of-iteration rule: at the send marked
//    flush_residual the residual is added and then dropped, and
//    BeginIteration() drops what an aborted iteration left.
// With the same codecs the payloads therefore equal the host path's, call
// for call (the CUDA codecs' payloads equal the CPU's byte for byte, except
// PowerSGD's, which agree within rounding: powersgd_payload.h).
//
// Paths: a link's first compressed send decides its path for good. When
// the backend answers UNIMPLEMENTED (no device twin of the codec, a host
// tensor, an empty one; the CPU backend always), Encode returns
// UNIMPLEMENTED for every later send of that link too, and the caller
// encodes them on the host (LinkCompressor). So a link's residual and codec
// state live on one side only.
//
// Links are keyed as LinkCompressor's: (peer stage, tensor kind, unit).
// No error samples: measuring ||x - x^|| would need the fp32 copy on the
// host that this path exists to avoid (the link statistics say so by their
// error_samples).
//
// Thread-safety: none; one instance per stage, used by the thread that
// drives the stage's backend (the device calls are queued on its stream).
#ifndef PIPETRAIN_WORKER_RUNTIME_DEVICE_LINK_ENCODER_H_
#define PIPETRAIN_WORKER_RUNTIME_DEVICE_LINK_ENCODER_H_

#include <map>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/model/backend.h"

namespace pipetrain {

class DeviceLinkEncoder {
 public:
  using LinkKey = std::tuple<int, int, int>;  // peer stage, tensor kind, unit

  // `backend` computes the stage's tensors and must outlive this.
  explicit DeviceLinkEncoder(Backend* backend) : backend_(backend) {}

  // PowerSGD's warm start Q of every link on the device path that has one,
  // copied to the host (Backend::Download), by link.
  std::map<LinkKey, Tensor> WarmStarts() const;
  // Makes host tensor `q` (uploaded) the warm start of `link` should its
  // sends take the device path; the host path keeps its own
  // (LinkCompressor::SetWarmStart).
  void SetWarmStart(const LinkKey& link, const Tensor& q);

  // Drops every residual (keeps codec states and the links' paths). Call
  // before an iteration's first send.
  void BeginIteration();

  // The payload of `x` (on the backend's device) for `send`, whose codec is
  // non-empty. `scores` as LinkCompressor::Encode (token_topk ranks tokens
  // by them; error-feedback sends ignore them). UNIMPLEMENTED when the link
  // takes the host path (see "Paths"). FAILED_PRECONDITION "training
  // diverged: ..." when the codec refuses `x` and it holds a NaN or an
  // infinity (as LinkCompressor::Encode; `x` is then downloaded to find
  // it). Otherwise the backend's
  // errors (INVALID_ARGUMENT for a finite value the codec cannot carry,
  // INTERNAL from the device), and INVALID_ARGUMENT when an error-feedback
  // send's shape differs from the link's residual; after any error the
  // link's residual is dropped (the iteration fails; error_feedback.h keeps
  // it, but nothing could use it).
  absl::StatusOr<std::string> Encode(const v1::Instruction::Send& send, const Tensor& x,
                                     absl::Span<const float> scores);

 private:
  // Undecided until the link's first send has been answered.
  enum class Path { kUndecided, kDevice, kHost };
  struct LinkState {
    Path path = Path::kUndecided;
    CodecState codec;  // on the backend's device
    Tensor residual;       // error feedback; null when none is held
  };

  absl::StatusOr<std::string> EncodeWithFeedback(const v1::Instruction::Send& send,
                                                 const Tensor& x, LinkState* link);

  Backend* backend_;
  std::map<LinkKey, LinkState> links_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_DEVICE_LINK_ENCODER_H_
