// LinkCompressor: a stage's side of compression on the wire (DESIGN.md §6).
// It encodes each send as the program's Send instruction says (codec, error
// feedback, flush; coordinator/planner/compression_marking.h) and decodes
// what arrives, keeping per link the state codecs and error feedback carry
// from call to call and counting what it did (LinkStats) for the metrics.
//
// Links: state is kept per (peer stage, tensor kind, unit), so two tensors
// of different shapes never share a residual or a PowerSGD Q.
//
// Iterations: BeginIteration() must be called before an iteration's first
// send. It drops any residual still held, which happens only when the
// previous iteration was aborted midway (a completed one flushes every
// residual at its flush_residual send), so no residual crosses an optimizer
// step. PowerSGD's warm-started Q is kept across iterations (it is a
// starting point for the power iteration, not an error term), and so it is
// what a checkpoint keeps of a link (WarmStarts, SetWarmStart).
//
// Error sampling: the relative error of a compressed send, measured on
// error-feedback sends (where decoding is needed anyway; there it is
// ErrorFeedback's ||y - y^|| / ||y|| for y = x + the carried residual: the
// new residual's size, error carried to the next send rather than lost)
// and otherwise on the first compressed send per link and iteration
// (||x - x^|| / ||x||, one extra decode).
//
// Not thread-safe: use an instance from one thread at a time (StageRuntime
// keeps one for its send thread and one for its receives).
#ifndef PIPETRAIN_WORKER_RUNTIME_LINK_COMPRESSOR_H_
#define PIPETRAIN_WORKER_RUNTIME_LINK_COMPRESSOR_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "kernels/compress/error_feedback.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/transport/transport.h"

namespace pipetrain {

// What one stage sent to (or received from) one peer, of one tensor kind,
// during one iteration.
struct LinkStats {
  int64_t tensors = 0;
  int64_t compressed_tensors = 0;  // encoded with a codec
  int64_t raw_bytes = 0;           // fp32 bytes before encoding (after decoding)
  int64_t wire_bytes = 0;          // bytes handed to (taken from) the transport
  double codec_seconds = 0;        // encoding (sends) or decoding (receives)
  double error_sum = 0;            // sampled relative errors (sends)
  int64_t error_samples = 0;
  // Of wire_bytes: moved device to device (LINK_PATH_DEVICE, NCCL) rather
  // than over the data plane.
  int64_t device_bytes = 0;
};

// Counts in `stats` one tensor that crossed a link: its raw and wire bytes,
// and for an encoded one the codec time. LinkCompressor counts its own
// sends and receives with it; the runtime counts with it what the backend
// encoded or decoded on its device (Backend::EncodeOnDevice,
// DecodeOnDevice), which gets no error sample (measuring it would need the
// fp32 host copy that the device path exists to avoid).
void CountTransfer(const WireTensor& wire, double codec_seconds, LinkStats* stats);

// Counts in `stats` one raw tensor that went device to device.
void CountDeviceTransfer(const Tensor& t, LinkStats* stats);

// Adds every count of `from` to `to`.
void AddLinkStats(const LinkStats& from, LinkStats* to);

class LinkCompressor {
 public:
  using LinkKey = std::tuple<int, int, int>;  // peer stage, tensor kind, unit

  void BeginIteration();

  // PowerSGD's warm start Q of every link that has one (host tensors, the
  // compressor's own copies), by link.
  std::map<LinkKey, Tensor> WarmStarts() const;
  // Makes `q` the warm start of `link`'s next encoding (PowerSgdStartQ
  // takes it when its shape fits the tensor, else draws the fixed start).
  void SetWarmStart(const LinkKey& link, Tensor q);

  // Encodes `x` for `send` (raw when send.codec() is empty). `scores`, when
  // non-empty, are token importances (one per token of x's [B, T]) that a
  // token_topk codec ranks tokens by instead of their L2 norm (acctfm
  // §4.3.1: the attention column sums); other codecs, and error-feedback
  // sends, ignore them. Errors: INVALID_ARGUMENT for an unknown codec spec
  // or a tensor the codec rejects (non-finite values, a score count other
  // than the token count), naming the send.
  absl::StatusOr<WireTensor> Encode(const v1::Instruction::Send& send, const Tensor& x,
                                    LinkStats* stats, const std::vector<float>& scores = {});

  // Decodes a received tensor (a raw one is returned as is); `what` names it
  // for errors (INVALID_ARGUMENT, as DecodeWireTensor).
  absl::StatusOr<Tensor> Decode(const WireTensor& wire, const std::string& what,
                                LinkStats* stats);

 private:
  struct LinkState {
    CodecState codec;
    ErrorFeedback feedback;
  };

  absl::StatusOr<const Codec*> CodecFor(const std::string& spec);
  absl::StatusOr<std::string> EncodeWithFeedback(const v1::Instruction::Send& send,
                                                 const Tensor& x, const Codec& codec,
                                                 LinkState* link, double* error);

  // By spec; at most kMaxCachedCodecs (CodecFor). A pointer CodecFor
  // returned is valid until its next call.
  static constexpr size_t kMaxCachedCodecs = 16;
  std::map<std::string, std::unique_ptr<Codec>> codecs_;
  std::map<LinkKey, LinkState> links_;
  std::set<LinkKey> sampled_;  // links whose error was measured this iteration
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_LINK_COMPRESSOR_H_
