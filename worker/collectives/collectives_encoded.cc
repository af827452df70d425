// Collectives::AllReduceEncoded (collectives.h): the all-reduce whose
// messages are codec payloads, for AccTFM's compressed tensor-parallel sums.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

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
  RETURN_IF_ERROR(CheckOnHost(tag, data));
  if (rows <= 0 || data.numel() % rows != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(tag), ": ", data.numel(), " values do not make ", rows, " rows"));
  }
  if (data.numel() == 0) {
    // Rows of width 0 (every member has the same shape): nothing to send or
    // sum, and the chunking below would divide by the width.
    if (stats != nullptr) *stats = EncodedStats{};
    if (coding_error != nullptr) *coding_error = Tensor::Zeros(data.shape());
    return absl::OkStatus();
  }
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  EncodedStats local;
  const int n = size();
  const int64_t width = data.numel() / rows;
  const std::string spec = codec.name();
  // The current round's segments (rows of `data`; see the rounds below).
  std::vector<std::pair<int64_t, int64_t>> bounds;
  // Each segment goes in chunks of whole rows, at most chunk_bytes of fp32
  // each (one row at least), so that a chunk travels while the next is
  // coded and a member sums and sends on its first chunks while the rest
  // are in flight. Every member cuts the same chunks from the shapes.
  const int64_t chunk_rows = std::max<int64_t>(1, options_.chunk_bytes / (4 * width));
  const auto chunks_of = [&](int s) {
    return (bounds[s].second - bounds[s].first + chunk_rows - 1) / chunk_rows;
  };
  const auto chunk_range = [&](int s, int64_t c) {  // rows [first, second) of data
    const int64_t begin = bounds[s].first + c * chunk_rows;
    return std::pair<int64_t, int64_t>{begin, std::min(bounds[s].second, begin + chunk_rows)};
  };
  const auto chunk_shape = [&](int s, int64_t c) {
    const auto [begin, end] = chunk_range(s, c);
    return Shape{end - begin, width};
  };
  // A chunk that is not finite, which no codec takes, travels raw and is
  // summed as it is: every member then meets one (its own, a raw
  // contribution, or a sum that is not finite, as the plain all-reduce's NaN
  // reaches every member), and once every message is exchanged all refuse
  // alike. One member refusing alone left the others waiting out their
  // timeouts. A finite chunk the codec refuses (fp16 past 65504) travels
  // raw too, exactly, and the call goes on: whether a sum fits the codec
  // depends on how many members re-encode it, and a large but finite
  // gradient is no divergence.
  bool not_finite = false;
  // One chunk coded for sending: its payload (empty when it goes raw) and
  // what the receivers will decode of it.
  struct Coded {
    std::string payload;
    Tensor decoded;
    bool raw = false;
    bool finite = true;  // false: raw because not finite
  };
  // One chunk to `to` (its message sequence advances as SendRange's); the
  // payload is moved out where `last` says no other member gets it.
  const auto send = [&](int to, Coded& coded, const Shape& shape, bool last) -> absl::Status {
    const int64_t bytes =
        coded.raw ? coded.decoded.numel() * 4 : static_cast<int64_t>(coded.payload.size());
    local.sent_bytes += bytes;
    sent_bytes_ += bytes;
    const absl::Status sent = transport_->SendWireOwned(
        group_.members[to], Address(iteration, tag, send_seq_[to]++),
        coded.raw ? WireTensor::Raw(coded.decoded.Clone())
        : last    ? WireTensor::Encoded(spec, std::move(coded.payload), shape)
                  : WireTensor::Encoded(spec, coded.payload, shape));
    if (sent.ok()) return sent;
    return absl::Status(sent.code(), absl::StrCat(Describe(tag), ": ", sent.message()));
  };
  // The next payload from member `from`, due with `shape`, decoded.
  const auto receive = [&](int from, const Shape& shape) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(WireTensor wire,
                     Annotated(transport_->RecvWire(group_.members[from],
                                                    Address(iteration, tag, recv_seq_[from]++),
                                                    options_.timeout),
                               Describe(tag)));
    // Raw only for a chunk that is not finite or that the codec refused
    // (above).
    if (!wire.encoded() && wire.tensor.shape() == shape && !wire.tensor.on_device()) {
      if (FirstNonFinite(wire.tensor) >= 0) not_finite = true;
      return std::move(wire.tensor);
    }
    if (!wire.encoded() || wire.codec != spec || wire.shape != shape) {
      return absl::InternalError(absl::StrCat(
          Describe(tag), ": member ", from, " sent ",
          wire.encoded() ? wire.codec : std::string("raw fp32"), " ",
          ShapeToString(wire.decoded_shape()), " where ", spec, " ", ShapeToString(shape),
          " was due (do all members run the same collectives with the same sizes?)"));
    }
    return DecodeWireTensorWith(codec, wire, Describe(tag));
  };

  // `values` through the codec (decoded here as the receivers will decode
  // them), or raw when they are not finite or the codec refuses them
  // (above).
  const auto code = [&](const Tensor& values) -> absl::StatusOr<Coded> {
    if (FirstNonFinite(values) >= 0) {
      not_finite = true;
      return Coded{"", values.Clone(), true, false};
    }
    Coded coded;
    absl::StatusOr<std::string> payload = codec.Encode(values, nullptr);
    if (!payload.ok()) return Coded{"", values.Clone(), true};  // exact, error 0
    coded.payload = *std::move(payload);
    ASSIGN_OR_RETURN(coded.decoded, Annotated(codec.Decode(coded.payload), Describe(tag)));
    return coded;
  };
  // This member's chunk of rows [begin, end), coded, its coding error
  // counted.
  const auto encode = [&](const Tensor& chunk, int64_t begin) -> absl::StatusOr<Coded> {
    ASSIGN_OR_RETURN(Coded coded, code(chunk));
    if (!coded.finite) return coded;  // the call refuses (finish)
    const Tensor& decoded = coded.decoded;
    if (stats != nullptr) {  // only who asks pays for the two passes
      local.norm_squared += SquaredNorm(chunk.data(), chunk.numel());
      if (!coded.raw) {  // a raw chunk is exact
        local.error_squared += SquaredDistance(chunk.data(), decoded.data(), chunk.numel());
      }
    }
    if (coding_error != nullptr && !coded.raw) {
      float* error = coding_error->data() + begin * width;
      for (int64_t i = 0; i < chunk.numel(); ++i) error[i] = chunk.data()[i] - decoded.data()[i];
    }
    return coded;
  };
  // Every message exchanged: the refusal all members make alike.
  const auto finish = [&]() -> absl::Status {
    if (stats != nullptr) *stats = local;
    if (!not_finite) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(tag),
                     ": values that are not finite (NaN or infinite) on some member or in their "
                     "sum (training diverged?)"));
  };
  if (coding_error != nullptr) *coding_error = Tensor::Zeros(data.shape());
  // Chunks are views of `data` (rows [begin, end) of [rows, width]).
  const Tensor matrix = data.Reshape({rows, width});

  // Two members: one exchange of the round's rows [first, first + count):
  // every chunk to the other member, then each chunk summed from the two
  // decoded contributions.
  const auto exchange = [&](int64_t first, int64_t count) -> absl::Status {
    const int other = 1 - rank_;
    const int64_t last_row = first + count;
    std::vector<Tensor> own;
    for (int64_t begin = first; begin < last_row; begin += chunk_rows) {
      const int64_t end = std::min(last_row, begin + chunk_rows);
      ASSIGN_OR_RETURN(Coded coded, encode(matrix.Slice(begin, end), begin));
      RETURN_IF_ERROR(send(other, coded, Shape{end - begin, width}, /*last=*/true));
      own.push_back(std::move(coded.decoded));
    }
    for (int64_t begin = first, c = 0; begin < last_row; begin += chunk_rows, ++c) {
      const int64_t end = std::min(last_row, begin + chunk_rows);
      ASSIGN_OR_RETURN(const Tensor theirs, receive(other, Shape{end - begin, width}));
      const Tensor& mine = own[static_cast<size_t>(c)];
      if (theirs.numel() != mine.numel()) {
        return absl::InternalError(absl::StrCat(Describe(tag), ": member ", other, " sent ",
                                                theirs.numel(), " values where ", mine.numel(),
                                                " were due"));
      }
      const float* parts[2] = {rank_ == 0 ? mine.data() : theirs.data(),
                               rank_ == 0 ? theirs.data() : mine.data()};
      float* out = data.data() + begin * width;
      for (int64_t i = 0; i < mine.numel(); ++i) out[i] = parts[0][i] + parts[1][i];
      // A sum that overflows: both members hold the same bits, and refuse
      // alike, as with three or more.
      if (FirstNonFinite(matrix.Slice(begin, end)) >= 0) not_finite = true;
    }
    return absl::OkStatus();
  };

  // Three or more: the round's rows in segments, in two phases.
  const auto reduce_scatter_gather = [&]() -> absl::Status {
    // Phase 1: every member's segment s to member s, encoded chunk by chunk
    // (chunk c to every member before chunk c + 1); this member's own
    // segment through the codec as well. All of it is encoded before phase 2
    // writes `data`.
    int64_t most_chunks = 0;
    for (int s = 0; s < n; ++s) most_chunks = std::max(most_chunks, chunks_of(s));
    std::vector<Tensor> own_contribution(static_cast<size_t>(chunks_of(rank_)));
    for (int64_t c = 0; c < most_chunks; ++c) {
      for (int k = 0; k < n; ++k) {
        const int to = (rank_ + k) % n;
        if (c >= chunks_of(to)) continue;
        const auto [begin, end] = chunk_range(to, c);
        ASSIGN_OR_RETURN(Coded coded, encode(matrix.Slice(begin, end), begin));
        if (to == rank_) {
          own_contribution[static_cast<size_t>(c)] = std::move(coded.decoded);
        } else {
          RETURN_IF_ERROR(send(to, coded, chunk_shape(to, c), /*last=*/true));
        }
      }
    }
    // Phase 2, chunk by chunk as the contributions arrive: this member's
    // chunk, the decoded contributions summed in member order straight from
    // where they were decoded, encoded to every member; every member (this
    // one too) keeps the decoded payload, so all hold the same bits.
    for (int64_t c = 0; c < chunks_of(rank_); ++c) {
      const Shape shape = chunk_shape(rank_, c);
      const int64_t length = shape[0] * width;
      std::vector<Tensor> contributions(n);
      std::vector<const float*> parts(n);
      for (int m = 0; m < n; ++m) {
        if (m == rank_) {
          contributions[m] = std::move(own_contribution[static_cast<size_t>(c)]);
        } else {
          ASSIGN_OR_RETURN(contributions[m], receive(m, shape));
        }
        if (contributions[m].numel() != length) {
          return absl::InternalError(absl::StrCat(Describe(tag), ": member ", m, " sent ",
                                                  contributions[m].numel(), " values where ",
                                                  length, " were due"));
        }
        parts[m] = contributions[m].data();
      }
      Tensor summed = Tensor::Uninitialized(shape);  // Filled next.
      MemberOrderTreeSum(parts, length, 0, n, summed.data());
      // Raw when the sum is not finite (a contribution that was not makes
      // it so: every member meets it) or the codec refuses it.
      ASSIGN_OR_RETURN(Coded coded, code(summed));
      for (int k = 1; k < n; ++k) RETURN_IF_ERROR(send((rank_ + k) % n, coded, shape, k == n - 1));
      const Tensor& mine = coded.decoded;
      std::memcpy(data.data() + chunk_range(rank_, c).first * width, mine.data(),
                  static_cast<size_t>(length) * sizeof(float));
      if (coding_error != nullptr && !coded.raw) {
        // What the second encoding dropped of the sum goes into the summing
        // member's feedback (one member's only): the members' coding errors
        // then add up to exactly what the result lacks of the sum.
        float* error = coding_error->data() + chunk_range(rank_, c).first * width;
        for (int64_t i = 0; i < length; ++i) error[i] += summed.data()[i] - mine.data()[i];
      }
    }
    // The other members' summed chunks.
    for (int k = 1; k < n; ++k) {
      const int s = (rank_ + k) % n;
      for (int64_t c = 0; c < chunks_of(s); ++c) {
        ASSIGN_OR_RETURN(const Tensor segment, receive(s, chunk_shape(s, c)));
        std::memcpy(data.data() + chunk_range(s, c).first * width, segment.data(),
                    static_cast<size_t>(segment.numel()) * sizeof(float));
      }
    }
    return absl::OkStatus();
  };

  // In rounds of whole rows, about kExchangeWindowsAhead exchange windows
  // of fp32 each (InRounds says why; one round below that, so a tensor of
  // up to a round goes exactly as in one): a member that starts late finds
  // at most about one round of its peers' payloads waiting, not a whole
  // stage's gradient, which could pass --mailbox-limit. Every member cuts
  // the same rounds and chunks, so all still hold the same bits; a refusal
  // waits until every round's messages are exchanged, so all members
  // refuse alike.
  const int64_t round_rows = std::max<int64_t>(1, kExchangeWindowsAhead * ExchangeWindow() / width);
  for (int64_t first = 0; first < rows; first += round_rows) {
    const int64_t count = std::min(round_rows, rows - first);
    if (n == 2) {
      RETURN_IF_ERROR(exchange(first, count));
      continue;
    }
    bounds = SegmentBounds(count, n);
    for (auto& [begin, end] : bounds) {
      begin += first;
      end += first;
    }
    RETURN_IF_ERROR(reduce_scatter_gather());
  }
  return finish();
}

}  // namespace pipetrain
