// Collectives over a group of stages (DESIGN.md §12): all-reduce (sum),
// reduce-scatter, all-gather and broadcast of fp32 tensors, on any
// Transport (the gRPC data plane between workers, the in-process one in
// tests), for data- and tensor-parallel groups.
//
// Algorithms:
//   ring               reduce-scatter then all-gather around the group
//                      (members in the order given), each segment sent in
//                      chunks of at most chunk_bytes so that the transport
//                      streams while the receiver adds: 2 (N-1)/N of the
//                      data crosses each link, the bandwidth optimum.
//   recursive doubling for tensors below small_bytes when N is a power of
//                      two: log2 N exchanges of the whole tensor, fewer
//                      latencies than the ring's 2 (N-1); and for two
//                      members at any size: one exchange moves what the
//                      ring's two rounds move, a latency less, and sums
//                      alike (the ring's segments are x0 + x1 and x1 + x0,
//                      bitwise equal). Chunked (ExchangeChunk), each
//                      chunk added as it arrives; sent in windows
//                      (ExchangeWindow) so that the partner holds a
//                      bounded part of the tensor, not all of it.
//   broadcast          the root sends to every member (star).
//   all-gather small   AllGatherSmall: every member sends its tensor to
//                      every member, then receives theirs (one latency).
//   gather             every member sends to the root (star).
//   member-order tree  AllReduceInMemberOrder: each member sends segment k
//                      straight to member k (the ring's volume, (N-1)/N of
//                      the data per member, in one round), which sums the
//                      N copies as a balanced tree in member order, then a
//                      ring all-gather, in rounds as AllReduce's ring; two
//                      members exchange once, as AllReduce. The sum's shape depends only on the
//                      member order (MemberOrderTreeSum), so reductions
//                      over nested groups can be made bitwise equal.
//
// Deterministic: every sum is taken in an order fixed by the group and the
// tensor's size, never by arrival time, and each element's total is
// computed once and then copied, so every rank ends with bitwise the same
// result, run after run. (Ring segment k sums x_k + x_k+1 + ... in ring
// order from member k; recursive doubling adds the lower rank's partial
// first.) The order differs from a sequential sum's, so a result equals
// one only to rounding (within a few ulps per term).
//
// Messages are TensorKind COLLECTIVE addressed by (job, iteration, tag,
// sequence number per sender): a caller gives each collective of an
// iteration its own tag, and every member must run the same collectives
// with the same sizes in the same order. A receive that waits longer than
// the timeout fails with DEADLINE_EXCEEDED naming the member and the
// collective. Not thread-safe: one collective at a time per object.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_COLLECTIVES_H_
#define PIPETRAIN_WORKER_COLLECTIVES_COLLECTIVES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "worker/collectives/all_reduce_algorithm.h"
#include "worker/transport/transport.h"

namespace pipetrain {

struct CollectiveGroup {
  // The transport's stage numbers of the members, in ring order; this
  // stage (Transport::stage()) must be one of them, once.
  std::vector<int> members;
  std::string job_id;  // the data-plane job the messages belong to
};

struct CollectiveOptions {
  // Messages at most this large (the ring's smaller for small tensors,
  // Collectives::RingChunk; recursive doubling's exchange_bytes).
  int64_t chunk_bytes = int64_t{1} << 20;
  // Recursive doubling below this (two members: at any size, which sums
  // bitwise as the ring does, so 0 still means the ring's sums).
  // (AllReduceRunsRecursiveDoubling, all_reduce_algorithm.h.)
  int64_t small_bytes = kSmallAllReduceBytes;
  absl::Duration timeout = absl::Seconds(60);
  // Recursive doubling's messages: at most this and chunk_bytes
  // (Collectives::ExchangeChunk says why this is smaller than the ring's).
  int64_t exchange_bytes = int64_t{256} << 10;
  // Recursive doubling sends at most kExchangeWindowsAhead windows of this
  // many bytes (whole messages, at least one) beyond what it has received
  // from its partner, so that a tensor larger than the partner's mailbox
  // (--mailbox-limit) is not refused there. Collectives::ExchangeWindow
  // says why it does not slow the exchange.
  int64_t exchange_window_bytes = int64_t{128} << 20;
};

// Windows of recursive doubling's exchange sent before the first is
// received (CollectiveOptions::exchange_window_bytes).
inline constexpr int kExchangeWindowsAhead = 2;

class Collectives {
 public:
  // INVALID_ARGUMENT (via status()) when the group is empty, names a member
  // twice or does not contain this transport's stage. `transport` must
  // outlive this.
  Collectives(Transport* transport, CollectiveGroup group, CollectiveOptions options = {});

  absl::Status status() const { return status_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(group_.members.size()); }

  // Every call below takes host tensors: one on a device (a device
  // backend's) is INVALID_ARGUMENT before anything is sent, as is a call
  // after a failed construction (status()).
  //
  // data <- the sum over members of each member's `data` (same shape on
  // every member), in place. Three or more members: a ring, in rounds of
  // kExchangeWindowsAhead exchange windows, so that at most about one
  // round of a neighbour's data waits at a member that joins late.
  absl::Status AllReduce(int64_t iteration, int tag, Tensor& data);
  // As AllReduce, but every element summed as MemberOrderTreeSum over the
  // members' values in group order, whatever N and the size: a group
  // [a0, b0, a1, b1, ...] gives bitwise what summing each pair (a_r + b_r)
  // and then all-reducing the pairs in this way over [0, 1, ...] gives
  // (fused embedding synchronization relies on it; DESIGN.md §12). In the
  // same rounds as AllReduce's ring, which leave each element's sum as it
  // is.
  absl::Status AllReduceInMemberOrder(int64_t iteration, int tag, Tensor& data);
  // The sum of every member's `data`, of which this member keeps segment
  // rank() (ring order), returned; segments split numel as evenly as
  // possible, the first numel % N one element longer (SegmentBounds).
  absl::StatusOr<Tensor> ReduceScatter(int64_t iteration, int tag, const Tensor& data);
  // Every member's `segment` (as ReduceScatter's), concatenated in rank
  // order into a flat tensor of `total` elements.
  absl::StatusOr<Tensor> AllGather(int64_t iteration, int tag, const Tensor& segment,
                                   int64_t total);
  // Every member's `segment` (as AllGather's) sent to rank `root` only,
  // which gets them concatenated in rank order (`total` elements); the other
  // members get an empty Tensor. (N-1)/N of the data crosses into the root
  // and nothing else moves but the grants below: for what only one member needs (a checkpoint's
  // unsplit tensors), where AllGather would give each member all of it.
  // In windows, as recursive doubling's exchange (exchange_window_bytes):
  // at most kExchangeWindowsAhead windows wait at the root at once, all
  // members together, so a wide group's gather stays within the root's
  // --mailbox-limit. Unless the other members' segments fit in that many
  // windows (then all are sent at once), the root grants every window with
  // a one-float message before it is sent, that many ahead of the one it
  // takes, taking window 0 of every member, then window 1, ... A member
  // waits for a grant up to timeout x (N - 1): the root takes a window of
  // every other member in between. So with grants even a member whose own
  // segment is small waits for the root to reach this Gather: a root that
  // comes later than that fails the members with DEADLINE_EXCEEDED.
  absl::StatusOr<Tensor> Gather(int64_t iteration, int tag, int root, const Tensor& segment,
                                int64_t total);
  // data <- root's data (rank `root`), in place.
  absl::Status Broadcast(int64_t iteration, int tag, int root, Tensor& data);
  // Every member's `data` (the same numel on every member), in rank order,
  // each of data's shape (this member's own a copy). Each member first
  // sends its whole `data` to every other member, then receives theirs: no
  // send waits for a receive, so the exchange costs one latency after the
  // last member arrives, where one Broadcast per root costs N (root r
  // sends only once it has received roots 0..r-1). Values are copied as
  // bytes, so every member gets bitwise the same tensors, and a reduction
  // over them in rank order (gradient clipping's global norm) gives every
  // member bitwise the same result. (N - 1) x data leaves each member at
  // once, without flow control: for small tensors (a few values per
  // parameter), not for gradients. Members that disagree on the size:
  // INTERNAL naming the member, as the other collectives.
  absl::StatusOr<std::vector<Tensor>> AllGatherSmall(int64_t iteration, int tag,
                                                     const Tensor& data);

  // A lossy all-reduce whose messages carry `codec`'s payloads (AccTFM's
  // compressed tensor-parallel sum, acctfm.txt §4.3.2): `data` is a host
  // tensor of `rows` rows (numel divisible by rows), the same shape on every
  // member. It goes in rounds of whole rows (below); within a round, the
  // round's rows split into size() segments (SegmentBounds over them);
  // every member encodes its segment s and sends it to member s, which
  // decodes the size() contributions (its own encoded and decoded too, so
  // every contribution passes the codec once) and sums them in member
  // order (MemberOrderTreeSum); member s then encodes its summed segment and
  // sends it to every member, and every member, s included, decodes it. So
  // every member ends with bitwise the same `data`, the sum of quantized
  // contributions quantized once more. Each phase sends (N-1)/N of the
  // round's encoded rows per member, like the ring's two phases.
  // Segments travel in chunks of whole rows, at most chunk_bytes of fp32
  // each (one row at least; every member cuts the same ones), each encoded
  // on its own (a quantizer with a per-payload range scales each chunk by
  // its own): all of this member's chunks of the round are encoded and
  // sent first, then member s sums, encodes and sends on chunk c as soon
  // as every member's chunk c has arrived, so the two phases overlap on
  // the links rather than the second waiting for the whole first. Empty
  // segments send nothing.
  // Two members exchange once instead, as AccTFM's recursive doubling does
  // (acctfm.txt §5 runs its compressed all-reduce so): each encodes its
  // round's rows in chunks of whole rows (cut as above, over the round's
  // rows) and sends them, and both sum the two decoded contributions in
  // member order (x0^ + x1^, the same bits on both): the sum of the
  // quantized contributions, not quantized again, in one exchange of the
  // same bytes.
  // All of this goes in rounds of whole rows, about kExchangeWindowsAhead
  // exchange windows of fp32 each (InRounds says why; a tensor of up to a
  // round goes in one), each round's rows segmented and chunked as above:
  // a member that starts late finds about one round of payloads waiting,
  // not a whole stage's gradient. Every member cuts the same rounds.
  // Payloads are checked on receipt: an unencoded message, another codec, or
  // a shape other than the segment's is INTERNAL naming the member (a peer
  // that runs other collectives), a payload the codec rejects
  // INVALID_ARGUMENT. A chunk that is not finite (NaN or infinite: no codec
  // takes it), a contribution or a sum, travels raw and is summed as it is;
  // once every message is exchanged the call is then INVALID_ARGUMENT on
  // every member alike ("not finite ..."), `data` holding what was summed.
  // A finite chunk the codec refuses (fp16 past 65504) travels raw as well,
  // exactly (its coding error 0), and the call goes on: whether it succeeds
  // does not depend on how many members re-encode a sum. A raw message of
  // the due shape is taken as such a chunk. Stats (may be null, which
  // spares two passes over the data): this call's payload bytes sent, and the squared L2 norms of
  // this member's contribution and of its coding error (decode(encode(x)) - x over all its
  // segments, or chunks). `coding_error` (may be null) gets, element by element, this member's
  // contribution minus what the codec let through of it (x -
  // decode(encode(x)), segment by segment as sent), plus, with three or
  // more members, on the segment this member sums, what the second
  // encoding dropped of the sum (sum - decode(encode(sum))): the residual
  // error feedback adds to the next contribution. Over all members the
  // coding errors add up to the sum of the contributions minus the result,
  // so no feedback is lost. Its shape is data's. A `data`
  // of no values sends nothing: OK, zero stats and an empty coding_error.
  struct EncodedStats {
    int64_t sent_bytes = 0;
    double norm_squared = 0;
    double error_squared = 0;
  };
  absl::Status AllReduceEncoded(int64_t iteration, int tag, const Codec& codec, int64_t rows,
                                Tensor& data, EncodedStats* stats = nullptr,
                                Tensor* coding_error = nullptr);

  // Bytes of every message this member has sent so far, fp32 values and
  // payloads (what crossed its links, for the wire-bytes metrics).
  int64_t sent_bytes() const { return sent_bytes_; }

  // parts[lo] + ... + parts[hi - 1] element-wise, as a balanced tree: a
  // range of n > 1 splits after its first m values, m the largest power of
  // two below n, and each half is summed so; e.g. n = 4 gives
  // (p0 + p1) + (p2 + p3), n = 3 gives (p0 + p1) + p2. Because m(2n) =
  // 2 m(n), summing 2n values this way equals summing their n adjacent
  // pairs first and then the pairs this way, bit for bit. `out` gets the
  // result (parts' length).
  static void MemberOrderTreeSum(const std::vector<std::vector<float>>& parts, int lo, int hi,
                                 std::vector<float>* out);
  // The same over `length` values at each of parts[lo, hi), into `out`
  // (which overlaps none of them), without copying them first.
  static void MemberOrderTreeSum(const std::vector<const float*>& parts, int64_t length, int lo,
                                 int hi, float* out);

  // Element ranges [begin, end) of the N segments of `numel` elements.
  static std::vector<std::pair<int64_t, int64_t>> SegmentBounds(int64_t numel, int n);

 private:
  // Ring phases on flat `values` (numel elements): Ring runs the reduce-
  // scatter, the all-gather or both as one pipeline of chunks.
  absl::Status Ring(int64_t iteration, int tag, float* values, int64_t numel, bool reduce_scatter,
                    bool all_gather);
  absl::Status RingReduceScatter(int64_t iteration, int tag, float* values, int64_t numel);
  absl::Status RingAllGather(int64_t iteration, int tag, float* values, int64_t numel);
  absl::Status RecursiveDoubling(int64_t iteration, int tag, float* values, int64_t numel);
  // Elements per message of a ring whose largest segment has `segment`
  // elements: at most chunk_bytes, and small enough that the segment goes
  // as kRingChunksPerSegment messages, but not below kMinRingChunkBytes.
  // Why: a chunk is added and passed on only once it has arrived whole, so
  // a segment sent as one message leaves each link idle while the next
  // member waits for all of it, once per step: the ring's pipeline fills
  // and drains in about one chunk's time per step, a fraction of about
  // 1 / kRingChunksPerSegment of the transfer. 4 members all-reducing a
  // 4 MiB bucket (the data-parallel stages' size) under an emulated 2.5
  // Gbit/s link on the 2-vCPU VM: 0.69 of the link with 1 MiB messages,
  // 0.87 with 256 KiB. 16 MiB under an emulated 10 Gbit/s link on 16
  // cores: 0.90 with 1 MiB (4 a segment), 0.94 with 256 KiB (16). The
  // floor keeps loopback, where each message costs CPU, as it was
  // (docs/benchmarks.md). The sums do not depend on it.
  int64_t RingChunk(int64_t segment) const;
  // Elements per message of recursive doubling's exchanges: exchange_bytes'
  // worth, or chunk_bytes' if that is smaller. Why: an
  // exchange sends the whole tensor each way at once and nothing waits for
  // a message but the final add, so a message's size shows only as the
  // tail: the last message's own transfer and add once the rest has
  // arrived. Two members all-reducing 16 MiB under an emulated 2.5 Gbit/s
  // link on the 2-vCPU VM: 0.92-0.94 of the link with 1 MiB messages,
  // 0.92-0.97 with 256 KiB, within that machine's noise; on loopback the
  // two measured alike (docs/benchmarks.md). The 16-core figure that
  // motivated it (0.894 with 1 MiB) has yet to be measured with 256 KiB.
  int64_t ExchangeChunk() const;
  // Elements per window of recursive doubling's exchange: whole
  // ExchangeChunk messages, about exchange_window_bytes' worth. Each member
  // sends kExchangeWindowsAhead windows, then window w + 2 only once it has
  // received its partner's window w: at most 2 x 2 windows of its data wait
  // at the partner (which sends window w only after receiving window
  // w - 2). Two windows ahead, the next window is queued while the current
  // one still streams, so the links never wait for it; and tensors up to
  // two windows (256 MiB by default, the collective benchmark's largest)
  // go exactly as before: all sent, then all received.
  int64_t ExchangeWindow() const;
  // Runs `round(first, count)` over [0, numel) in rounds of
  // kExchangeWindowsAhead exchange windows (256 MiB by default; one round
  // below that), stopping at the first error. Why: the ring and the
  // member-order exchange have no flow control, so a member that starts
  // late finds (N - 1) / N of what the others are all-reducing waiting in
  // its mailbox, the pass-ons of the members before it; over a whole
  // stage's gradient (GPU gradients without a device group) that passed
  // --mailbox-limit. A round ends on a member only once every member has
  // joined it, so at most about one round waits.
  absl::Status InRounds(
      int64_t numel, const std::function<absl::Status(int64_t first, int64_t count)>& round) const;
  // Sends values[begin, end) to member `to` in chunks of `chunk` elements
  // (0: chunk_bytes' worth); receives the same range, cut alike, from member
  // `from`, and adds (`add`) or copies it into `values`.
  absl::Status SendRange(int64_t iteration, int tag, int to, const float* values, int64_t begin,
                         int64_t end, int64_t chunk = 0);
  absl::Status RecvRange(int64_t iteration, int tag, int from, float* values, int64_t begin,
                         int64_t end, bool add, int64_t chunk = 0);
  // One message of `len` values from member `from`, waited for up to
  // `timeout` (options.timeout when zero); INTERNAL if it holds another
  // count or lies on a device.
  absl::StatusOr<Tensor> RecvChunk(int64_t iteration, int tag, int from, int64_t len,
                                   absl::Duration timeout = absl::ZeroDuration());
  // The ring's step for one chunk, values[begin, end): receives it from
  // `from`, adds (`add`) or copies it into `values`, and with `pass_on`
  // sends the result to `to` as SendRange would, in the received tensor
  // itself where this holds its only handle (the sum written to both in
  // one pass): no copy, no allocation.
  absl::Status RecvChunkAndPassOn(int64_t iteration, int tag, int from, int to, float* values,
                                  int64_t begin, int64_t end, bool add, bool pass_on);
  // INVALID_ARGUMENT naming the collective if `data` lies on a device:
  // these collectives read and write host memory (device tensors go
  // through a DeviceCollective, worker/model/device_collective.h).
  absl::Status CheckOnHost(int tag, const Tensor& data) const;
  // INVALID_ARGUMENT if `segment` lies on a device, or unless it has the
  // `holds` values this rank's segment of `total` has (AllGather, Gather).
  absl::Status CheckSegment(int tag, const Tensor& segment, int64_t holds, int64_t total) const;
  TensorAddress Address(int64_t iteration, int tag, int seq) const;
  std::string Describe(int tag) const;

  Transport* const transport_;
  const CollectiveGroup group_;
  const CollectiveOptions options_;
  absl::Status status_;
  int rank_ = -1;
  // Per collective call: the next sequence number of messages this member
  // sends to each member, and expects from each member.
  std::vector<int> send_seq_, recv_seq_;
  int64_t sent_bytes_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_COLLECTIVES_H_
