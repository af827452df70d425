#include "worker/runtime/link_compressor.h"

#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/program_text.h"
#include "common/status_macros.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/token_topk_codec.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ||x - y|| / ||x||; 0 for an all-zero x.
double RelativeError(const Tensor& x, const Tensor& y) {
  double error_sq = 0, norm_sq = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = double{x[i]} - y[i];
    error_sq += d * d;
    norm_sq += double{x[i]} * x[i];
  }
  return norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : 0.0;
}

std::string SendName(const v1::Instruction::Send& send) {
  v1::Instruction in;
  *in.mutable_send() = send;
  return DescribeInstruction(in);
}

}  // namespace

void CountTransfer(const WireTensor& wire, double codec_seconds, LinkStats* stats) {
  ++stats->tensors;
  stats->raw_bytes += wire.raw_bytes();
  stats->wire_bytes += wire.wire_bytes();
  if (!wire.encoded()) return;
  ++stats->compressed_tensors;
  stats->codec_seconds += codec_seconds;
}

void CountDeviceTransfer(const Tensor& t, LinkStats* stats) {
  const WireTensor wire = WireTensor::Raw(t);
  CountTransfer(wire, 0, stats);
  stats->device_bytes += wire.wire_bytes();
}

void AddLinkStats(const LinkStats& from, LinkStats* to) {
  to->tensors += from.tensors;
  to->compressed_tensors += from.compressed_tensors;
  to->raw_bytes += from.raw_bytes;
  to->wire_bytes += from.wire_bytes;
  to->codec_seconds += from.codec_seconds;
  to->error_sum += from.error_sum;
  to->error_samples += from.error_samples;
  to->device_bytes += from.device_bytes;
}

void LinkCompressor::BeginIteration() {
  sampled_.clear();
  for (auto& [key, link] : links_) link.feedback.Flush();
}

std::map<LinkCompressor::LinkKey, Tensor> LinkCompressor::WarmStarts() const {
  std::map<LinkKey, Tensor> out;
  for (const auto& [key, link] : links_) {
    if (!link.codec.powersgd_q.is_null()) out[key] = link.codec.powersgd_q.Clone();
  }
  return out;
}

void LinkCompressor::SetWarmStart(const LinkKey& link, Tensor q) {
  links_[link].codec.powersgd_q = std::move(q);
}

absl::StatusOr<const Codec*> LinkCompressor::CodecFor(const std::string& spec) {
  auto it = codecs_.find(spec);
  if (it != codecs_.end()) return it->second.get();
  ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(spec));
  // A peer names the codecs it sends, and one spec has many spellings
  // ("linear:bits=3", "linear:bits=3.0"): the cache starts over rather
  // than grow with them. A job's own links use a handful.
  if (codecs_.size() >= kMaxCachedCodecs) codecs_.clear();
  return (codecs_[spec] = std::move(codec)).get();
}

// Lazy error propagation (Optimus-CC §5.1, error_feedback.h): the stored
// residual goes into this tensor; at the flush send it is added and then
// dropped, so the iteration ends with no residual.
absl::StatusOr<std::string> LinkCompressor::EncodeWithFeedback(const v1::Instruction::Send& send,
                                                               const Tensor& x,
                                                               const Codec& codec,
                                                               LinkState* link, double* error) {
  if (!send.flush_residual()) return link->feedback.Compress(x, codec, &link->codec, error);
  ASSIGN_OR_RETURN(std::string payload, link->feedback.Compress(x, codec, &link->codec, error));
  link->feedback.Flush();
  return payload;
}

absl::StatusOr<WireTensor> LinkCompressor::Encode(const v1::Instruction::Send& send,
                                                  const Tensor& x, LinkStats* stats,
                                                  const std::vector<float>& scores) {
  if (send.codec().empty()) {
    WireTensor wire = WireTensor::Raw(x);
    CountTransfer(wire, 0, stats);
    return wire;
  }
  auto fail = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(SendName(send), ": ", s.message()));
  };
  auto codec = CodecFor(send.codec());
  if (!codec.ok()) return fail(codec.status());
  const LinkKey key{send.peer_stage(), send.tensor().kind(), send.tensor().unit()};
  LinkState& link = links_[key];
  const auto start = Clock::now();
  double error = -1;
  const auto* token_topk = dynamic_cast<const TokenTopKCodec*>(*codec);
  absl::StatusOr<std::string> payload =
      send.error_feedback() ? EncodeWithFeedback(send, x, **codec, &link, &error)
      : (token_topk != nullptr && !scores.empty())
          ? token_topk->EncodeWithScores(x, scores, &link.codec)
          : (*codec)->Encode(x, &link.codec);
  const double seconds = SecondsSince(start);
  if (!payload.ok()) {
    // Codecs carry finite values only. A NaN or infinity here means the
    // training diverged (an infinite gradient broke the weights while its
    // step's loss was still finite): said so, as an uncompressed job says
    // at the loss, not as a codec's fault.
    if (std::string bad = DescribeFirstNonFinite(x); !bad.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "training diverged: ", SendName(send), ": the tensor ", bad,
          " (the weights or an input of this step are no longer finite); try a lower learning "
          "rate, a warm-up or gradient clipping"));
    }
    return fail(payload.status());
  }
  if (error < 0 && sampled_.insert(key).second) {
    auto decoded = (*codec)->Decode(*payload);
    if (!decoded.ok()) return fail(decoded.status());
    error = RelativeError(x, *decoded);
  }
  if (error >= 0) {
    stats->error_sum += error;
    ++stats->error_samples;
  }
  WireTensor wire = WireTensor::Encoded(send.codec(), *std::move(payload), x.shape());
  CountTransfer(wire, seconds, stats);
  return wire;
}

absl::StatusOr<Tensor> LinkCompressor::Decode(const WireTensor& wire, const std::string& what,
                                              LinkStats* stats) {
  if (!wire.encoded()) {
    CountTransfer(wire, 0, stats);
    return wire.tensor;
  }
  auto codec = CodecFor(wire.codec);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": codec \"", wire.codec, "\": ", codec.status().message()));
  }
  const auto start = Clock::now();
  absl::StatusOr<Tensor> decoded = DecodeWireTensorWith(**codec, wire, what);
  CountTransfer(wire, SecondsSince(start), stats);
  return decoded;
}

}  // namespace pipetrain
