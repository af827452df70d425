// Collectives::AllReduceEncoded (collectives.h): the all-reduce whose
// messages are codec payloads, for AccTFM's compressed tensor-parallel sums.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/collectives.h"

namespace pipetrain {
namespace {

double SquaredNorm(const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

double SquaredDistance(const float* x, const float* y, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - y[i];
    sum += d * d;
  }
  return sum;
}

// `value`, or its error with "<what>: " in front.
template <typename T>
absl::StatusOr<T> Annotated(absl::StatusOr<T> value, const std::string& what) {
  if (value.ok()) return value;
  return absl::Status(value.status().code(), absl::StrCat(what, ": ", value.status().message()));
}

}  // namespace

absl::Status Collectives::AllReduceEncoded(int64_t iteration, int tag, const Codec& codec,
                                           int64_t rows, Tensor& data, EncodedStats* stats,
                                           Tensor* coding_error) {
  RETURN_IF_ERROR(status_);
  if (data.on_device()) {
    return absl::InvalidArgumentError(Describe(tag) + ": the tensor is on a device");
  }
  if (rows <= 0 || data.numel() % rows != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(tag), ": ", data.numel(), " values do not make ", rows, " rows"));
  }
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  EncodedStats local;
  const int n = size();
  const int64_t width = data.numel() / rows;
  const std::string spec = codec.name();
  const auto bounds = SegmentBounds(rows, n);
  const auto segment_shape = [&](int s) {
    return Shape{bounds[s].second - bounds[s].first, width};
  };
  // One payload to `to` (its message sequence advances as SendRange's).
  const auto send = [&](int to, std::string payload, const Shape& shape) -> absl::Status {
    local.sent_bytes += static_cast<int64_t>(payload.size());
    sent_bytes_ += static_cast<int64_t>(payload.size());
    const absl::Status sent =
        transport_->SendWireOwned(group_.members[to], Address(iteration, tag, send_seq_[to]++),
                                  WireTensor::Encoded(spec, std::move(payload), shape));
    if (sent.ok()) return sent;
    return absl::Status(sent.code(), absl::StrCat(Describe(tag), ": ", sent.message()));
  };
  // The payload of segment `s` from member `from`, decoded.
  const auto receive = [&](int from, int s) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(WireTensor wire,
                     Annotated(transport_->RecvWire(group_.members[from],
                                                    Address(iteration, tag, recv_seq_[from]++),
                                                    options_.timeout),
                               Describe(tag)));
    if (!wire.encoded() || wire.codec != spec || wire.shape != segment_shape(s)) {
      return absl::InternalError(
          absl::StrCat(Describe(tag), ": member ", from, " sent ",
                       wire.encoded() ? wire.codec : std::string("raw fp32"), " ",
                       ShapeToString(wire.decoded_shape()), " where ", spec, " ",
                       ShapeToString(segment_shape(s)),
                       " was due (do all members run the same collectives with the same sizes?)"));
    }
    return DecodeWireTensorWith(codec, wire, Describe(tag));
  };

  // Phase 1: every member's segment s to member s, encoded; this member's
  // own segment through the codec as well.
  if (coding_error != nullptr) *coding_error = Tensor::Zeros(data.shape());
  // Segments are views of `data` (rows [begin, end) of [rows, width]), read
  // before phase 2 writes it.
  const Tensor matrix = data.Reshape({rows, width});
  Tensor own_contribution;
  for (int k = 0; k < n; ++k) {
    const int to = (rank_ + k) % n;
    const Tensor segment = matrix.Slice(bounds[to].first, bounds[to].second);
    ASSIGN_OR_RETURN(std::string payload, Annotated(codec.Encode(segment, nullptr), Describe(tag)));
    // This member's coding error: its payloads decoded here as the
    // receiver will decode them.
    ASSIGN_OR_RETURN(Tensor decoded, Annotated(codec.Decode(payload), Describe(tag)));
    if (stats != nullptr) {  // only who asks pays for the two passes
      local.norm_squared += SquaredNorm(segment.data(), segment.numel());
      local.error_squared += SquaredDistance(segment.data(), decoded.data(), segment.numel());
    }
    if (coding_error != nullptr) {
      float* error = coding_error->data() + bounds[to].first * width;
      for (int64_t i = 0; i < segment.numel(); ++i) {
        error[i] = segment.data()[i] - decoded.data()[i];
      }
    }
    if (to == rank_) {
      own_contribution = std::move(decoded);
    } else {
      RETURN_IF_ERROR(send(to, std::move(payload), segment_shape(to)));
    }
  }
  // This member's segment: the decoded contributions, summed in member
  // order straight from where they were decoded.
  const int64_t mine = own_contribution.numel();
  std::vector<Tensor> contributions(n);
  std::vector<const float*> parts(n);
  for (int m = 0; m < n; ++m) {
    if (m == rank_) {
      contributions[m] = own_contribution;
    } else {
      ASSIGN_OR_RETURN(contributions[m], receive(m, rank_));
    }
    if (contributions[m].numel() != mine) {
      return absl::InternalError(absl::StrCat(Describe(tag), ": member ", m, " sent ",
                                              contributions[m].numel(), " values where ", mine,
                                              " were due"));
    }
    parts[m] = contributions[m].data();
  }
  // Phase 2: the summed segment, encoded, to every member; every member
  // (this one too) keeps the decoded payload, so all hold the same bits.
  Tensor summed = Tensor::Uninitialized(segment_shape(rank_));  // Filled next.
  MemberOrderTreeSum(parts, mine, 0, n, summed.data());
  ASSIGN_OR_RETURN(std::string payload, Annotated(codec.Encode(summed, nullptr), Describe(tag)));
  for (int k = 1; k < n; ++k) {
    RETURN_IF_ERROR(send((rank_ + k) % n, payload, segment_shape(rank_)));
  }
  for (int k = 0; k < n; ++k) {
    const int s = (rank_ + k) % n;
    Tensor segment;
    if (s == rank_) {
      ASSIGN_OR_RETURN(segment, Annotated(codec.Decode(payload), Describe(tag)));
    } else {
      ASSIGN_OR_RETURN(segment, receive(s, s));
    }
    std::memcpy(data.data() + bounds[s].first * width, segment.data(),
                static_cast<size_t>(segment.numel()) * sizeof(float));
  }
  if (stats != nullptr) *stats = local;
  return absl::OkStatus();
}

}  // namespace pipetrain
