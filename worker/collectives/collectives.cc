#include "worker/collectives/collectives.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Whole floats in a message of at most `bytes`, at least one.
int64_t FloatsIn(int64_t bytes) { return std::max<int64_t>(1, bytes / 4); }

// RingChunk's bounds (collectives.h says why).
constexpr int64_t kRingChunksPerSegment = 16;
constexpr int64_t kMinRingChunkBytes = int64_t{256} << 10;

absl::Status Annotate(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

Collectives::Collectives(Transport* transport, CollectiveGroup group, CollectiveOptions options)
    : transport_(transport), group_(std::move(group)), options_(options) {
  const int n = static_cast<int>(group_.members.size());
  for (int i = 0; i < n; ++i) {
    if (std::count(group_.members.begin(), group_.members.end(), group_.members[i]) > 1) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("collective group [", absl::StrJoin(group_.members, ", "), "] names stage ",
                       group_.members[i], " twice"));
      return;
    }
    if (group_.members[i] == transport_->stage()) rank_ = i;
  }
  if (n == 0 || rank_ < 0) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("collective group [", absl::StrJoin(group_.members, ", "),
                     "] does not contain this stage (", transport_->stage(), ")"));
    return;
  }
  send_seq_.assign(n, 0);
  recv_seq_.assign(n, 0);
}

std::vector<std::pair<int64_t, int64_t>> Collectives::SegmentBounds(int64_t numel, int n) {
  std::vector<std::pair<int64_t, int64_t>> bounds;
  const int64_t base = numel / n, extra = numel % n;
  int64_t begin = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t end = begin + base + (i < extra ? 1 : 0);
    bounds.emplace_back(begin, end);
    begin = end;
  }
  return bounds;
}

TensorAddress Collectives::Address(int64_t iteration, int tag, int seq) const {
  TensorAddress a;
  a.job_id = group_.job_id;
  a.iteration = iteration;
  a.kind = v1::TENSOR_KIND_COLLECTIVE;
  a.micro_batch = seq;
  a.unit = tag;
  return a;
}

std::string Collectives::Describe(int tag) const {
  return absl::StrCat("collective ", tag, " of group [", absl::StrJoin(group_.members, ", "),
                      "] (rank ", rank_, ")");
}

int64_t Collectives::RingChunk(int64_t segment) const {
  const int64_t most = FloatsIn(options_.chunk_bytes);
  const int64_t least = std::min(most, kMinRingChunkBytes / 4);
  const int64_t even = (segment + kRingChunksPerSegment - 1) / kRingChunksPerSegment;
  return std::clamp(even, least, most);
}

int64_t Collectives::ExchangeChunk() const {
  return FloatsIn(std::min(options_.chunk_bytes, options_.exchange_bytes));
}

int64_t Collectives::ExchangeWindow() const {
  const int64_t chunk = ExchangeChunk();
  return std::max<int64_t>(1, FloatsIn(options_.exchange_window_bytes) / chunk) * chunk;
}

absl::Status Collectives::SendRange(int64_t iteration, int tag, int to, const float* values,
                                    int64_t begin, int64_t end, int64_t chunk) {
  if (chunk <= 0) chunk = FloatsIn(options_.chunk_bytes);
  for (int64_t off = begin; off < end; off += chunk) {
    const int64_t len = std::min(chunk, end - off);
    Tensor piece = Tensor::Uninitialized({len});  // Filled next.
    std::memcpy(piece.data(), values + off, static_cast<size_t>(len) * sizeof(float));
    // A fresh copy the transport may send without copying it again.
    absl::Status sent = transport_->SendOwned(
        group_.members[to], Address(iteration, tag, send_seq_[to]++), std::move(piece));
    if (!sent.ok()) return Annotate(sent, Describe(tag));
    sent_bytes_ += len * static_cast<int64_t>(sizeof(float));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Collectives::RecvChunk(int64_t iteration, int tag, int from, int64_t len,
                                              absl::Duration timeout) {
  absl::StatusOr<WireTensor> wire =
      transport_->RecvWire(group_.members[from], Address(iteration, tag, recv_seq_[from]++),
                           timeout > absl::ZeroDuration() ? timeout : options_.timeout);
  if (!wire.ok()) return Annotate(wire.status(), Describe(tag));
  // Checked before anything is decoded: these collectives send raw fp32
  // chunks, and an encoded payload declaring a larger shape would have the
  // receiver allocate and decode it first (a peer's 256 KiB of PowerSGD
  // factors can declare 4 GiB).
  const int64_t values = NumElements(wire->decoded_shape());
  if (wire->encoded() || wire->tensor.on_device() || values != len) {
    return absl::InternalError(absl::StrCat(
        Describe(tag), ": member ", from, " sent ", values, wire->encoded() ? " encoded" : "",
        " values where ", len,
        " raw ones were due (do all members run the same collectives with the same sizes?)"));
  }
  return std::move(wire->tensor);
}

absl::Status Collectives::RecvRange(int64_t iteration, int tag, int from, float* values,
                                    int64_t begin, int64_t end, bool add, int64_t chunk) {
  if (chunk <= 0) chunk = FloatsIn(options_.chunk_bytes);
  for (int64_t off = begin; off < end; off += chunk) {
    const int64_t len = std::min(chunk, end - off);
    ASSIGN_OR_RETURN(Tensor got, RecvChunk(iteration, tag, from, len));
    const float* in = got.data();
    float* out = values + off;
    if (add) {
      for (int64_t i = 0; i < len; ++i) out[i] += in[i];
    } else {
      std::memcpy(out, in, static_cast<size_t>(len) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status Collectives::RecvChunkAndPassOn(int64_t iteration, int tag, int from, int to,
                                             float* values, int64_t begin, int64_t end, bool add,
                                             bool pass_on) {
  const int64_t len = end - begin;
  ASSIGN_OR_RETURN(Tensor got, RecvChunk(iteration, tag, from, len));
  float* in = got.data();
  float* out = values + begin;
  // Only a tensor no one else holds may be written and handed over (a
  // transport's own copy; a shared one could be read elsewhere).
  const bool forward_received = pass_on && got.sole_owner();
  if (add && forward_received) {
    // out + in, as RecvRange adds (IEEE addition commutes: the same bits).
    for (int64_t i = 0; i < len; ++i) in[i] = out[i] = out[i] + in[i];
  } else if (add) {
    for (int64_t i = 0; i < len; ++i) out[i] += in[i];
  } else {
    std::memcpy(out, in, static_cast<size_t>(len) * sizeof(float));
  }
  if (!pass_on) return absl::OkStatus();
  if (!forward_received) return SendRange(iteration, tag, to, values, begin, end);
  absl::Status sent = transport_->SendOwned(
      group_.members[to], Address(iteration, tag, send_seq_[to]++), std::move(got));
  if (!sent.ok()) return Annotate(sent, Describe(tag));
  sent_bytes_ += len * static_cast<int64_t>(sizeof(float));
  return absl::OkStatus();
}

// The ring's steps as one pipeline of chunks. Reduce-scatter step s sends
// segment r-s-1 (holding the sum of the s+1 members before this one) and
// adds the left neighbour's segment r-s-2 into its own; after n-1 steps this
// member holds the whole sum of segment r, summed in ring order from member
// r+1. All-gather step s sends segment r-s (complete) and copies in segment
// r-s-1. The segment received in one step is the one sent in the next (also
// from the last reduce-scatter step, whose segment r is then complete, to
// the first all-gather step), so each chunk is passed on as soon as it has
// arrived and been added rather than after its whole segment, and every link
// stays busy. Each neighbour sends and receives the same chunks in the same
// order as step by step, and the additions are the same: the results are
// bitwise those of the plain ring.
absl::Status Collectives::Ring(int64_t iteration, int tag, float* values, int64_t numel,
                               bool reduce_scatter, bool all_gather) {
  const int n = size();
  const auto bounds = SegmentBounds(numel, n);
  const int right = Mod(rank_ + 1, n), left = Mod(rank_ - 1, n);
  struct Step {
    int in_segment;
    bool add;
  };
  std::vector<Step> steps;
  if (reduce_scatter) {
    for (int s = 0; s + 1 < n; ++s) steps.push_back({Mod(rank_ - s - 2, n), true});
  }
  if (all_gather) {
    for (int s = 0; s + 1 < n; ++s) steps.push_back({Mod(rank_ - s - 1, n), false});
  }
  if (steps.empty()) return absl::OkStatus();
  const auto& first = bounds[reduce_scatter ? Mod(rank_ - 1, n) : rank_];
  // Segment 0 is the longest (SegmentBounds); every member cuts the same.
  const int64_t chunk = RingChunk(bounds[0].second - bounds[0].first);
  RETURN_IF_ERROR(SendRange(iteration, tag, right, values, first.first, first.second, chunk));
  for (size_t k = 0; k < steps.size(); ++k) {
    const auto [begin, end] = bounds[steps[k].in_segment];
    const bool pass_on = k + 1 < steps.size();
    for (int64_t off = begin; off < end; off += chunk) {  // the chunks SendRange makes
      const int64_t stop = std::min(end, off + chunk);
      RETURN_IF_ERROR(RecvChunkAndPassOn(iteration, tag, left, right, values, off, stop,
                                         steps[k].add, pass_on));
    }
  }
  return absl::OkStatus();
}

absl::Status Collectives::RingReduceScatter(int64_t iteration, int tag, float* values,
                                            int64_t numel) {
  return Ring(iteration, tag, values, numel, /*reduce_scatter=*/true, /*all_gather=*/false);
}

absl::Status Collectives::RingAllGather(int64_t iteration, int tag, float* values, int64_t numel) {
  return Ring(iteration, tag, values, numel, /*reduce_scatter=*/false, /*all_gather=*/true);
}

absl::Status Collectives::RecursiveDoubling(int64_t iteration, int tag, float* values,
                                            int64_t numel) {
  // Round d: exchange with the member d away and add. Both of a pair add
  // the same two partial sums (addition commutes), so they agree bitwise,
  // and after log2 n rounds every member holds the same total. SendRange
  // copies each chunk before it goes, so the partner's chunks are added in
  // place as they arrive; a window is sent before the same window is
  // received (and added), so what goes is still this member's own part.
  const int64_t chunk = ExchangeChunk();
  const int64_t window = ExchangeWindow();
  for (int d = 1; d < size(); d <<= 1) {
    const int partner = rank_ ^ d;
    int64_t sent = std::min(numel, kExchangeWindowsAhead * window);
    RETURN_IF_ERROR(SendRange(iteration, tag, partner, values, 0, sent, chunk));
    for (int64_t begin = 0; begin < numel; begin += window) {
      const int64_t end = std::min(numel, begin + window);
      RETURN_IF_ERROR(RecvRange(iteration, tag, partner, values, begin, end, /*add=*/true, chunk));
      if (sent < numel) {
        const int64_t next = std::min(numel, sent + window);
        RETURN_IF_ERROR(SendRange(iteration, tag, partner, values, sent, next, chunk));
        sent = next;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Collectives::AllReduce(int64_t iteration, int tag, Tensor& data) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(CheckOnHost(tag, data));
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  if (size() == 1 || data.numel() == 0) return absl::OkStatus();
  // Two members: one exchange at any size. It moves what the ring moves
  // (the whole tensor each way) in one round instead of two, a latency
  // less, and sums alike: the ring's segments are x0 + x1 and x1 + x0,
  // bitwise equal.
  if (AllReduceRunsRecursiveDoubling(size(), static_cast<double>(data.size_bytes()),
                                     options_.small_bytes)) {
    return RecursiveDoubling(iteration, tag, data.data(), data.numel());
  }
  // The ring, in rounds (InRounds says why).
  return InRounds(data.numel(), [&](int64_t first, int64_t count) {
    return Ring(iteration, tag, data.data() + first, count, /*reduce_scatter=*/true,
                /*all_gather=*/true);
  });
}

absl::Status Collectives::InRounds(
    int64_t numel, const std::function<absl::Status(int64_t first, int64_t count)>& round) const {
  const int64_t round_elements = kExchangeWindowsAhead * ExchangeWindow();
  for (int64_t first = 0; first < numel; first += round_elements) {
    RETURN_IF_ERROR(round(first, std::min(round_elements, numel - first)));
  }
  return absl::OkStatus();
}

void Collectives::MemberOrderTreeSum(const std::vector<const float*>& parts, int64_t length, int lo,
                                     int hi, float* out) {
  const int n = hi - lo;
  if (n == 1) {
    std::copy(parts[lo], parts[lo] + length, out);
    return;
  }
  if (n == 2) {  // as the general case below, without the copies
    const float* a = parts[lo];
    const float* b = parts[lo + 1];
    for (int64_t i = 0; i < length; ++i) out[i] = a[i] + b[i];
    return;
  }
  int m = 1;
  while (2 * m < n) m *= 2;  // the largest power of two below n
  std::vector<float> right(static_cast<size_t>(length));
  MemberOrderTreeSum(parts, length, lo, lo + m, out);
  MemberOrderTreeSum(parts, length, lo + m, hi, right.data());
  for (int64_t i = 0; i < length; ++i) out[i] += right[i];
}

void Collectives::MemberOrderTreeSum(const std::vector<std::vector<float>>& parts, int lo, int hi,
                                     std::vector<float>* out) {
  std::vector<const float*> pointers;
  for (const std::vector<float>& part : parts) pointers.push_back(part.data());
  const int64_t length = static_cast<int64_t>(parts[lo].size());
  out->resize(static_cast<size_t>(length));
  MemberOrderTreeSum(pointers, length, lo, hi, out->data());
}

absl::Status Collectives::AllReduceInMemberOrder(int64_t iteration, int tag, Tensor& data) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(CheckOnHost(tag, data));
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  const int n = size();
  if (n == 1 || data.numel() == 0) return absl::OkStatus();
  // Two members: one exchange, as AllReduce; x0 + x1 (= x1 + x0) is the
  // two-member tree sum, bitwise.
  if (n == 2) return RecursiveDoubling(iteration, tag, data.data(), data.numel());
  // In rounds, as AllReduce's ring (InRounds says why); each element's sum
  // is the same tree over the members whatever the round.
  return InRounds(data.numel(), [&](int64_t first, int64_t numel) -> absl::Status {
    float* values = data.data() + first;
    const auto bounds = SegmentBounds(numel, n);
    // Every member's segment k goes to member k, in one go (sends do not
    // wait for their receives).
    for (int k = 1; k < n; ++k) {
      const int to = Mod(rank_ + k, n);
      RETURN_IF_ERROR(SendRange(iteration, tag, to, values, bounds[to].first, bounds[to].second));
    }
    const auto [begin, end] = bounds[rank_];
    std::vector<std::vector<float>> copies(n);
    for (int m = 0; m < n; ++m) {
      copies[m].resize(static_cast<size_t>(end - begin));
      if (m == rank_) {
        std::copy(values + begin, values + end, copies[m].begin());
      } else {
        RETURN_IF_ERROR(
            RecvRange(iteration, tag, m, copies[m].data(), 0, end - begin, /*add=*/false));
      }
    }
    std::vector<float> sum;
    MemberOrderTreeSum(copies, 0, n, &sum);
    std::copy(sum.begin(), sum.end(), values + begin);
    return RingAllGather(iteration, tag, values, numel);
  });
}

absl::StatusOr<Tensor> Collectives::ReduceScatter(int64_t iteration, int tag, const Tensor& data) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(CheckOnHost(tag, data));
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  Tensor all = data.Clone();
  RETURN_IF_ERROR(RingReduceScatter(iteration, tag, all.data(), all.numel()));
  const auto [begin, end] = SegmentBounds(all.numel(), size())[rank_];
  Tensor mine = Tensor::Zeros({end - begin});
  std::memcpy(mine.data(), all.data() + begin, static_cast<size_t>(end - begin) * sizeof(float));
  return mine;
}

absl::Status Collectives::CheckOnHost(int tag, const Tensor& data) const {
  if (!data.on_device()) return absl::OkStatus();
  return absl::InvalidArgumentError(Describe(tag) + ": the tensor is on a device");
}

absl::Status Collectives::CheckSegment(int tag, const Tensor& segment, int64_t holds,
                                       int64_t total) const {
  RETURN_IF_ERROR(CheckOnHost(tag, segment));
  if (segment.numel() == holds) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Describe(tag), ": segment of ", segment.numel(),
                                                 " values; rank ", rank_, " of ", total, " holds ",
                                                 holds));
}

absl::StatusOr<Tensor> Collectives::AllGather(int64_t iteration, int tag, const Tensor& segment,
                                              int64_t total) {
  RETURN_IF_ERROR(status_);
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  const auto [begin, end] = SegmentBounds(total, size())[rank_];
  RETURN_IF_ERROR(CheckSegment(tag, segment, end - begin, total));
  Tensor all = Tensor::Zeros({total});
  std::memcpy(all.data() + begin, segment.data(), static_cast<size_t>(end - begin) * sizeof(float));
  RETURN_IF_ERROR(RingAllGather(iteration, tag, all.data(), total));
  return all;
}

absl::StatusOr<Tensor> Collectives::Gather(int64_t iteration, int tag, int root,
                                           const Tensor& segment, int64_t total) {
  RETURN_IF_ERROR(status_);
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(tag), ": no rank ", root));
  }
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  const std::vector<std::pair<int64_t, int64_t>> bounds = SegmentBounds(total, size());
  const auto [begin, end] = bounds[rank_];
  RETURN_IF_ERROR(CheckSegment(tag, segment, end - begin, total));
  // In windows of whole messages (exchange_window_bytes), which the root
  // takes in turn (window 0 of every member, then window 1, ...), sending
  // a member a grant (one float) for each window before it may send it,
  // kExchangeWindowsAhead grants ahead of what it has taken: at most that
  // many windows wait at the root at once, whatever the number of members
  // (granting each member its own windows ahead let 2 x (N - 1) wait,
  // past --mailbox-limit for a wide group). A gather whose other segments
  // together fit in that many windows goes without grants: all sent at
  // once. Every member decides alike (from total and the group).
  const int64_t chunk = FloatsIn(options_.chunk_bytes);
  const int64_t window =
      std::max<int64_t>(1, FloatsIn(options_.exchange_window_bytes) / chunk) * chunk;
  const auto windows_of = [window](int64_t len) { return (len + window - 1) / window; };
  const int64_t root_len = bounds[root].second - bounds[root].first;
  const bool granted = total - root_len > kExchangeWindowsAhead * window;
  if (rank_ != root) {
    const int64_t len = end - begin;
    for (int64_t w = 0; w < windows_of(len); ++w) {
      if (granted) {
        // The root takes a window of every other member between two of
        // this member's.
        ASSIGN_OR_RETURN(const Tensor grant,
                         RecvChunk(iteration, tag, root, 1, options_.timeout * (size() - 1)));
      }
      RETURN_IF_ERROR(SendRange(iteration, tag, root, segment.data(), w * window,
                                std::min(len, (w + 1) * window), chunk));
    }
    return Tensor();
  }
  Tensor all = Tensor::Uninitialized({total});  // every segment is copied in below
  std::memcpy(all.data() + begin, segment.data(), static_cast<size_t>(end - begin) * sizeof(float));
  // The windows in the order the root takes them: (member, window).
  std::vector<std::pair<int, int64_t>> order;
  int64_t most = 0;
  for (const auto& [first, last] : bounds) most = std::max(most, windows_of(last - first));
  for (int64_t w = 0; w < most; ++w) {
    for (int m = 0; m < size(); ++m) {
      if (m != root && w < windows_of(bounds[m].second - bounds[m].first)) order.push_back({m, w});
    }
  }
  size_t grants_sent = 0;
  // Grants the windows of `order` before index `upto`.
  const auto grant_before = [&](size_t upto) -> absl::Status {
    if (!granted) return absl::OkStatus();
    for (; grants_sent < std::min(upto, order.size()); ++grants_sent) {
      const int m = order[grants_sent].first;
      // A float, for the transport; not counted in sent_bytes (no data).
      const absl::Status sent = transport_->SendOwned(
          group_.members[m], Address(iteration, tag, send_seq_[m]++), Tensor::Zeros({1}));
      if (!sent.ok()) return Annotate(sent, Describe(tag));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(grant_before(kExchangeWindowsAhead));
  for (size_t i = 0; i < order.size(); ++i) {
    const auto [m, w] = order[i];
    const int64_t first = bounds[m].first, len = bounds[m].second - first;
    RETURN_IF_ERROR(RecvRange(iteration, tag, m, all.data(), first + w * window,
                              first + std::min(len, (w + 1) * window), /*add=*/false, chunk));
    RETURN_IF_ERROR(grant_before(i + 1 + kExchangeWindowsAhead));
  }
  return all;
}

absl::Status Collectives::Broadcast(int64_t iteration, int tag, int root, Tensor& data) {
  RETURN_IF_ERROR(status_);
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(tag), ": no rank ", root));
  }
  RETURN_IF_ERROR(CheckOnHost(tag, data));
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  if (rank_ == root) {
    for (int m = 0; m < size(); ++m) {
      if (m != root) RETURN_IF_ERROR(SendRange(iteration, tag, m, data.data(), 0, data.numel()));
    }
    return absl::OkStatus();
  }
  return RecvRange(iteration, tag, root, data.data(), 0, data.numel(), /*add=*/false);
}

absl::StatusOr<std::vector<Tensor>> Collectives::AllGatherSmall(int64_t iteration, int tag,
                                                                const Tensor& data) {
  RETURN_IF_ERROR(status_);
  RETURN_IF_ERROR(CheckOnHost(tag, data));
  std::fill(send_seq_.begin(), send_seq_.end(), 0);
  std::fill(recv_seq_.begin(), recv_seq_.end(), 0);
  // All sends before the first receive: no member's send waits for another
  // member's, so the whole exchange is one round of latency.
  for (int k = 1; k < size(); ++k) {
    const int to = Mod(rank_ + k, size());
    RETURN_IF_ERROR(SendRange(iteration, tag, to, data.data(), 0, data.numel()));
  }
  std::vector<Tensor> all;
  for (int m = 0; m < size(); ++m) {
    if (m == rank_) {
      all.push_back(data.Clone());
      continue;
    }
    Tensor got = Tensor::Uninitialized(data.shape());  // every value is copied in
    RETURN_IF_ERROR(RecvRange(iteration, tag, m, got.data(), 0, data.numel(), /*add=*/false));
    all.push_back(std::move(got));
  }
  return all;
}

}  // namespace pipetrain
