#include "worker/collectives/collectives.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "gtest/gtest.h"
#include "kernels/compress/fp16_codec.h"
#include "kernels/compress/piecewise_codec.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// Member m's input: values drawn from a seeded generator, of mixed
// magnitudes so that the order of a sum shows in its bits.
std::vector<float> Input(int member, int64_t numel) {
  std::mt19937 random(1000 + member);
  std::uniform_real_distribution<float> value(-1, 1);
  std::vector<float> out(static_cast<size_t>(numel));
  for (float& v : out) v = value(random) * std::pow(10.0f, float(random() % 7) - 3);
  return out;
}

// Runs `body(rank, collectives)` on one thread per member of an n-member
// group (stages 0..n-1 of an in-process fabric) and returns each status.
std::vector<absl::Status> RunGroup(int n, const CollectiveOptions& options,
                                   const std::function<absl::Status(int, Collectives&)>& body) {
  InProcessFabric fabric(n);
  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[i] = i;
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> transport = fabric.Connect(r);
      Collectives collectives(transport.get(), CollectiveGroup{members, "j"}, options);
      status[r] = collectives.status().ok() ? body(r, collectives) : collectives.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

// All-reduces every member's Input on n members; returns each result.
std::vector<std::vector<float>> AllReduceResults(int n, int64_t numel,
                                                 const CollectiveOptions& options) {
  std::vector<std::vector<float>> results(n);
  const std::vector<absl::Status> status = RunGroup(n, options, [&](int r, Collectives& c) {
    std::vector<float> in = Input(r, numel);
    Tensor t = Tensor::FromVector({numel}, in);
    absl::Status s = c.AllReduce(/*iteration=*/3, /*tag=*/1, t);
    results[r] = t.ToVector();
    return s;
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
  return results;
}

struct Case {
  int members;
  int64_t numel;
  int64_t chunk_bytes;
  int64_t small_bytes;
};

class AllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllReduceTest, EveryRankBitwiseEqual_CloseToTheExactSum_SameRunAfterRun) {
  const Case c = GetParam();
  const CollectiveOptions options{c.chunk_bytes, c.small_bytes, absl::Seconds(30)};
  const auto first = AllReduceResults(c.members, c.numel, options);
  for (int r = 1; r < c.members; ++r) EXPECT_EQ(first[r], first[0]) << "rank " << r;
  // The exact sum, in double, against each element.
  std::vector<double> exact(static_cast<size_t>(c.numel), 0.0);
  std::vector<double> magnitude(static_cast<size_t>(c.numel), 0.0);
  for (int m = 0; m < c.members; ++m) {
    const std::vector<float> in = Input(m, c.numel);
    for (int64_t i = 0; i < c.numel; ++i) {
      exact[i] += in[i];
      magnitude[i] += std::fabs(in[i]);
    }
  }
  for (int64_t i = 0; i < c.numel; ++i) {
    // n-1 roundings of partial sums no larger than the sum of magnitudes.
    ASSERT_LE(std::fabs(first[0][i] - exact[i]), c.members * 6e-8 * magnitude[i] + 1e-30)
        << "element " << i;
  }
  const auto second = AllReduceResults(c.members, c.numel, options);
  EXPECT_EQ(second[0], first[0]) << "not deterministic";
}

INSTANTIATE_TEST_SUITE_P(
    RingAndRecursiveDoubling, AllReduceTest,
    ::testing::Values(Case{2, 1000, 1 << 20, 0},        // two members: one exchange
                      Case{3, 100003, 4096, 0},         // ring, uneven segments, many chunks
                      Case{4, 7, 1 << 20, 0},           // ring, fewer elements than... almost
                      Case{5, 3, 16, 0},                // ring, some segments empty
                      Case{4, 1000, 1 << 20, 1 << 20},  // recursive doubling
                      Case{8, 513, 64, 1 << 20},        // recursive doubling, chunked
                      Case{6, 5000, 1 << 20, 1 << 20},  // not a power of two: ring
                      // ring with default messages: segments of 500,001 and
                      // 500,000 floats go as RingChunk's 65,536-float
                      // messages (its 256 KiB floor), the last one shorter
                      Case{4, 2000003, 1 << 20, 0},
                      Case{1, 10, 1 << 20, 0}));  // one member: unchanged

// Two members exchange once at any size, chunked, each adding the other's
// chunks as they arrive: every element is the one IEEE sum x0 + x1 (the
// same bits as the ring's x0 + x1 and x1 + x0), on both members.
TEST(CollectivesTest, TwoMembers_EveryElementTheTwoTermSum) {
  constexpr int64_t kNumel = 100003;  // 25 chunks of 4 KiB, the last short
  const CollectiveOptions options{/*chunk_bytes=*/16384, /*small_bytes=*/0, absl::Seconds(30)};
  const auto got = AllReduceResults(2, kNumel, options);
  const std::vector<float> a = Input(0, kNumel), b = Input(1, kNumel);
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < kNumel; ++i) {
      ASSERT_EQ(got[r][i], a[i] + b[i]) << "member " << r << " element " << i;
    }
  }
}

// A transport that keeps a handle to every tensor it receives (so the
// receiver is not its only holder) and a snapshot of its values.
class HoldingTransport : public Transport {
 public:
  explicit HoldingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    absl::StatusOr<WireTensor> got = inner_->RecvWire(peer, address, timeout);
    if (got.ok() && !got->encoded()) {
      held.push_back(got->tensor);
      snapshots.push_back(got->tensor.ToVector());
    }
    return got;
  }
  std::vector<Tensor> held;
  std::vector<std::vector<float>> snapshots;

 private:
  std::unique_ptr<Transport> inner_;
};

// All-reduces Input(r, numel) on two members over `transports` (one per
// member), and expects every element on both to be the one IEEE sum
// x0 + x1.
void ExpectTwoMemberSums(int64_t numel, const CollectiveOptions& options,
                         const std::vector<Transport*>& transports) {
  std::vector<std::vector<float>> got(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Collectives c(transports[r], CollectiveGroup{{0, 1}, "j"}, options);
      Tensor t = Tensor::FromVector({numel}, Input(r, numel));
      status[r] = c.AllReduce(/*iteration=*/3, /*tag=*/1, t);
      got[r] = t.ToVector();
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<float> a = Input(0, numel), b = Input(1, numel);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    for (int64_t i = 0; i < numel; ++i) {
      ASSERT_EQ(got[r][i], a[i] + b[i]) << "member " << r << " element " << i;
    }
  }
}

// Two members with the default options exchange 256 KiB messages
// (ExchangeChunk), not chunk_bytes' 1 MiB: 1,000,003 floats go as 15
// messages of 65,536 floats and one of 16,963, and the sums are still the
// one IEEE sum x0 + x1 on both members.
TEST(CollectivesTest, TwoMembers_DefaultOptions_ExchangeIn256KiBMessages) {
  constexpr int64_t kNumel = 1000003;
  const CollectiveOptions options;
  ASSERT_EQ(options.chunk_bytes, int64_t{1} << 20);
  InProcessFabric fabric(2);
  std::vector<std::unique_ptr<HoldingTransport>> transports;
  for (int r = 0; r < 2; ++r) {
    transports.push_back(std::make_unique<HoldingTransport>(fabric.Connect(r)));
  }
  ExpectTwoMemberSums(kNumel, options, {transports[0].get(), transports[1].get()});
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(transports[r]->held.size(), 16u) << "member " << r;
    for (size_t i = 0; i < 16; ++i) {
      EXPECT_EQ(transports[r]->held[i].numel(), i < 15 ? 65536 : 16963)
          << "member " << r << " message " << i;
    }
  }
}

// Counts, per sender, the bytes it has sent that its receiver has not yet
// taken (what waits in the receiver's mailbox), and the most ever waiting.
class InFlight {
 public:
  void Sent(int from, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_[from] += bytes;
    most_[from] = std::max(most_[from], waiting_[from]);
    Count();
    sent_.notify_all();
  }
  // Until at least `bytes` of `from`'s wait at once.
  bool AwaitWaiting(int from, int64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    return sent_.wait_for(lock, std::chrono::minutes(1), [&] { return waiting_[from] >= bytes; });
  }
  void Taken(int from, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_[from] -= bytes;
  }
  int64_t most(int from) {
    std::lock_guard<std::mutex> lock(mu_);
    return most_[from];
  }
  // The most bytes that waited at once, all senders together.
  int64_t most_total() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_total_;
  }

 private:
  void Count() {
    int64_t total = 0;
    for (const auto& [from, bytes] : waiting_) total += bytes;
    most_total_ = std::max(most_total_, total);
  }

  std::mutex mu_;
  std::condition_variable sent_;
  std::map<int, int64_t> waiting_, most_;
  int64_t most_total_ = 0;
};

class CountingTransport : public Transport {
 public:
  CountingTransport(std::unique_ptr<Transport> inner, InFlight* in_flight)
      : inner_(std::move(inner)), in_flight_(in_flight) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    in_flight_->Sent(stage(), wire.wire_bytes());  // before it can be taken
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    absl::StatusOr<WireTensor> got = inner_->RecvWire(peer, address, timeout);
    if (got.ok()) in_flight_->Taken(peer, got->wire_bytes());
    return got;
  }

 private:
  std::unique_ptr<Transport> inner_;
  InFlight* in_flight_;
};

// Two members exchange in windows: each has at most 2 x 2 windows of its
// data waiting at its partner (CollectiveOptions::exchange_window_bytes),
// not the whole tensor, and the sums are still the one IEEE sum x0 + x1.
// 64 KiB messages in 256 KiB windows over a 4 MiB tensor (16 windows, the
// last one short).
TEST(CollectivesTest, TwoMembers_ExchangeInWindows_PartnerHoldsAtMostFourWindows) {
  constexpr int64_t kNumel = (int64_t{1} << 20) + 1000;
  CollectiveOptions options;
  options.exchange_bytes = int64_t{64} << 10;
  options.exchange_window_bytes = int64_t{256} << 10;
  InProcessFabric fabric(2);
  InFlight in_flight;
  std::vector<std::unique_ptr<CountingTransport>> transports;
  for (int r = 0; r < 2; ++r) {
    transports.push_back(std::make_unique<CountingTransport>(fabric.Connect(r), &in_flight));
  }
  ExpectTwoMemberSums(kNumel, options, {transports[0].get(), transports[1].get()});
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(in_flight.most(r), 4 * options.exchange_window_bytes) << "member " << r;
  }
}

// Counts the members waiting in a receive that found nothing there yet.
class Blocked {
 public:
  void Enter() {
    AnnotatedMutexLock lock(&mu_);
    ++waiting_;
  }
  void Leave() {
    AnnotatedMutexLock lock(&mu_);
    --waiting_;
  }
  // Until `n` wait at once.
  bool AwaitWaiting(int n) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ >= n; },
                                absl::Minutes(1));
  }

 private:
  AnnotatedMutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// A receive that finds nothing waiting (a probe of no time) is counted in
// `blocked` while it waits.
class ProbingTransport : public Transport {
 public:
  ProbingTransport(Transport* inner, Blocked* blocked) : inner_(inner), blocked_(blocked) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    absl::StatusOr<WireTensor> got = inner_->RecvWire(peer, address, absl::ZeroDuration());
    if (got.ok() || got.status().code() != absl::StatusCode::kDeadlineExceeded) return got;
    blocked_->Enter();
    got = inner_->RecvWire(peer, address, timeout);
    blocked_->Leave();
    return got;
  }

 private:
  Transport* const inner_;
  Blocked* const blocked_;
};

// Four members in a ring, member 2 joining once the other three wait for
// it: member 1's data waiting at member 2 stays within about one round
// (kExchangeWindowsAhead windows), not (N - 1) / N of the tensor, and every
// member holds the same sums. 64 KiB messages, 256 KiB windows: 512 KiB
// rounds over 4 MiB.
TEST(CollectivesTest, Ring_LateMember_AtMostAboutOneRoundWaitsForIt) {
  constexpr int kMembers = 4;
  constexpr int64_t kNumel = (int64_t{1} << 20) + 1000;
  CollectiveOptions options;
  options.chunk_bytes = int64_t{64} << 10;
  options.exchange_bytes = int64_t{64} << 10;
  options.exchange_window_bytes = int64_t{256} << 10;
  options.small_bytes = 0;
  InProcessFabric fabric(kMembers);
  InFlight in_flight;
  Blocked blocked;
  std::vector<std::unique_ptr<CountingTransport>> counting;
  std::vector<std::unique_ptr<ProbingTransport>> transports;
  for (int r = 0; r < kMembers; ++r) {
    counting.push_back(std::make_unique<CountingTransport>(fabric.Connect(r), &in_flight));
    transports.push_back(std::make_unique<ProbingTransport>(counting.back().get(), &blocked));
  }
  std::vector<std::vector<float>> got(kMembers);
  std::vector<absl::Status> status(kMembers);
  const auto run = [&](int r) {
    Collectives c(transports[r].get(), CollectiveGroup{{0, 1, 2, 3}, "j"}, options);
    Tensor t = Tensor::FromVector({kNumel}, Input(r, kNumel));
    status[r] = c.AllReduce(/*iteration=*/3, /*tag=*/1, t);
    got[r] = t.ToVector();
  };
  std::vector<std::thread> threads;
  for (int r : {0, 1, 3}) threads.emplace_back(run, r);
  // The three wait for member 2, member 1 having sent all it can without
  // it: its first segment of the round and the two it passes on.
  const int64_t round_bytes = kExchangeWindowsAhead * options.exchange_window_bytes;
  EXPECT_TRUE(blocked.AwaitWaiting(3));  // on, to end the threads, if not
  EXPECT_TRUE(in_flight.AwaitWaiting(1, 3 * round_bytes / 4));
  threads.emplace_back(run, 2);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kMembers; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
    EXPECT_LE(in_flight.most(r), round_bytes + 2 * options.chunk_bytes) << "member " << r;
  }
  EXPECT_GT(in_flight.most(1), round_bytes / 2);  // it did run ahead of member 2
}

// The ring passes a received chunk on in place only when it holds the
// tensor's only handle: held elsewhere, the chunk is left as it came and
// the result is bitwise the same.
TEST(CollectivesTest, Ring_ReceivedTensorsHeldElsewhere_LeftAsTheyCame) {
  constexpr int kMembers = 3;
  constexpr int64_t kNumel = 3000;
  const CollectiveOptions options{/*chunk_bytes=*/1024, /*small_bytes=*/0, absl::Seconds(30)};
  const auto want = AllReduceResults(kMembers, kNumel, options);
  InProcessFabric fabric(kMembers);
  std::vector<std::vector<float>> got(kMembers);
  std::vector<std::unique_ptr<HoldingTransport>> transports;
  for (int r = 0; r < kMembers; ++r) {
    transports.push_back(std::make_unique<HoldingTransport>(fabric.Connect(r)));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(kMembers);
  for (int r = 0; r < kMembers; ++r) {
    threads.emplace_back([&, r] {
      Collectives c(transports[r].get(), CollectiveGroup{{0, 1, 2}, "j"}, options);
      Tensor t = Tensor::FromVector({kNumel}, Input(r, kNumel));
      status[r] = c.AllReduce(/*iteration=*/3, /*tag=*/1, t);
      got[r] = t.ToVector();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kMembers; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], want[r]) << "rank " << r;
    ASSERT_FALSE(transports[r]->held.empty());
    for (size_t i = 0; i < transports[r]->held.size(); ++i) {
      EXPECT_EQ(transports[r]->held[i].ToVector(), transports[r]->snapshots[i])
          << "rank " << r << " message " << i;
    }
  }
}

TEST(CollectivesTest, ReduceScatterThenAllGather_EqualsAllReduce) {
  constexpr int n = 3;
  constexpr int64_t numel = 1001;
  const CollectiveOptions options{256, 0, absl::Seconds(30)};
  const auto reduced = AllReduceResults(n, numel, options);
  std::vector<std::vector<float>> gathered(n), segments(n);
  const auto status = RunGroup(n, options, [&](int r, Collectives& c) -> absl::Status {
    Tensor in = Tensor::FromVector({numel}, Input(r, numel));
    absl::StatusOr<Tensor> segment = c.ReduceScatter(5, 2, in);
    if (!segment.ok()) return segment.status();
    segments[r] = segment->ToVector();
    absl::StatusOr<Tensor> all = c.AllGather(5, 3, *segment, numel);
    if (!all.ok()) return all.status();
    gathered[r] = all->ToVector();
    return absl::OkStatus();
  });
  for (const absl::Status& s : status) ASSERT_TRUE(s.ok()) << s;
  const auto bounds = Collectives::SegmentBounds(numel, n);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(gathered[r], reduced[0]) << "rank " << r;
    EXPECT_EQ(segments[r], std::vector<float>(reduced[0].begin() + bounds[r].first,
                                              reduced[0].begin() + bounds[r].second));
  }
}

// Gather gives the root what AllGather gives everyone (uneven segments,
// many chunks, every root), and the others an empty tensor; only the root
// receives, so only the others send.
TEST(CollectivesTest, Gather_RootGetsWhatAllGatherGivesOthersNothing) {
  constexpr int n = 4;
  constexpr int64_t numel = 1003;  // segments of 251, 251, 251, 250
  const CollectiveOptions options{256, 0, absl::Seconds(30)};
  const auto bounds = Collectives::SegmentBounds(numel, n);
  auto segment_of = [&](int r) {
    const std::vector<float> all = Input(0, numel);
    return Tensor::FromVector(
        {bounds[r].second - bounds[r].first},
        std::vector<float>(all.begin() + bounds[r].first, all.begin() + bounds[r].second));
  };
  for (int root = 0; root < n; ++root) {
    std::vector<std::vector<float>> got(n);
    std::vector<int64_t> sent(n);
    const auto status = RunGroup(n, options, [&](int r, Collectives& c) -> absl::Status {
      absl::StatusOr<Tensor> all = c.Gather(7, 1, root, segment_of(r), numel);
      if (!all.ok()) return all.status();
      got[r] = all->numel() > 0 ? all->ToVector() : std::vector<float>();
      sent[r] = c.sent_bytes();
      return absl::OkStatus();
    });
    for (const absl::Status& s : status) ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < n; ++r) {
      if (r == root) {
        EXPECT_EQ(got[r], Input(0, numel)) << "root " << root;
        EXPECT_EQ(sent[r], 0) << "root " << root;
      } else {
        EXPECT_TRUE(got[r].empty()) << "rank " << r << ", root " << root;
        EXPECT_EQ(sent[r], (bounds[r].second - bounds[r].first) * 4) << "rank " << r;
      }
    }
  }
  const auto refused = RunGroup(2, options, [&](int, Collectives& c) {
    return c.Gather(7, 1, /*root=*/2, Tensor::Zeros({1}), 2).status();
  });
  for (const absl::Status& s : refused) EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

// A gather of segments many windows long: the root gets every segment,
// and at most 2 windows wait for it at once, all members together (sent
// whole, the other members' segments all piled up at the root while it
// read the first; granted 2 ahead per member, 2 x 3 windows waited).
// 64 KiB messages in 256 KiB windows; segments of 1 MiB and a bit (5
// windows, the last one short).
TEST(CollectivesTest, Gather_InWindows_RootHoldsAtMostTwoWindows) {
  constexpr int kMembers = 4;
  constexpr int64_t kNumel = kMembers * ((int64_t{1} << 18) + 100);
  CollectiveOptions options;
  options.chunk_bytes = int64_t{64} << 10;
  options.exchange_window_bytes = int64_t{256} << 10;
  const std::vector<float> input = Input(0, kNumel);
  const auto bounds = Collectives::SegmentBounds(kNumel, kMembers);
  InProcessFabric fabric(kMembers);
  InFlight in_flight;
  std::vector<std::unique_ptr<CountingTransport>> transports;
  for (int r = 0; r < kMembers; ++r) {
    transports.push_back(std::make_unique<CountingTransport>(fabric.Connect(r), &in_flight));
  }
  std::vector<std::vector<float>> got(kMembers);
  std::vector<absl::Status> status(kMembers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kMembers; ++r) {
    threads.emplace_back([&, r] {
      Collectives c(transports[r].get(), CollectiveGroup{{0, 1, 2, 3}, "j"}, options);
      const Tensor segment = Tensor::FromVector(
          {bounds[r].second - bounds[r].first},
          std::vector<float>(input.begin() + bounds[r].first, input.begin() + bounds[r].second));
      absl::StatusOr<Tensor> all =
          c.Gather(/*iteration=*/5, /*tag=*/2, /*root=*/1, segment, kNumel);
      status[r] = all.status();
      if (all.ok() && all->numel() > 0) got[r] = all->ToVector();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kMembers; ++r)
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  EXPECT_EQ(got[1], input);
  for (int r : {0, 2, 3}) EXPECT_TRUE(got[r].empty()) << r;
  // 2 windows, and the root's one-float grants (at most 2 wait, 4 bytes each).
  EXPECT_LE(in_flight.most_total(), 2 * options.exchange_window_bytes + 2 * 4);
}

// AllReduceInMemberOrder over [a0, b0, a1, b1, ...] equals, bit for bit,
// adding each pair and then reducing the pairs the same way over D
// members: the property fused embedding synchronization rests on. Checked
// against MemberOrderTreeSum computed here, for D = 1..5 and sizes that
// leave segments empty and that need many chunks and rounds (128 floats a
// round here).
TEST(CollectivesTest, MemberOrder_PairsFirstEqualsFusedBitwise) {
  for (int d = 1; d <= 5; ++d) {
    for (int64_t numel : {int64_t{3}, int64_t{1001}}) {
      SCOPED_TRACE(::testing::Message() << "D=" << d << " numel=" << numel);
      CollectiveOptions options{64, 0, absl::Seconds(30)};
      options.exchange_bytes = 64;
      options.exchange_window_bytes = 256;
      // Fused: 2D members, member 2r holds a_r = Input(2r), 2r+1 b_r.
      std::vector<std::vector<float>> fused(2 * d);
      auto status = RunGroup(2 * d, options, [&](int r, Collectives& c) {
        Tensor t = Tensor::FromVector({numel}, Input(r, numel));
        absl::Status s = c.AllReduceInMemberOrder(1, 7, t);
        fused[r] = t.ToVector();
        return s;
      });
      for (const absl::Status& s : status) ASSERT_TRUE(s.ok()) << s;
      // Unfused: each pair summed (a_r + b_r), then D members.
      std::vector<std::vector<float>> unfused(d);
      status = RunGroup(d, options, [&](int r, Collectives& c) {
        std::vector<float> pair = Input(2 * r, numel);
        const std::vector<float> b = Input(2 * r + 1, numel);
        for (int64_t i = 0; i < numel; ++i) pair[i] += b[i];
        Tensor t = Tensor::FromVector({numel}, pair);
        absl::Status s = c.AllReduceInMemberOrder(1, 7, t);
        unfused[r] = t.ToVector();
        return s;
      });
      for (const absl::Status& s : status) ASSERT_TRUE(s.ok()) << s;
      std::vector<std::vector<float>> inputs;
      for (int m = 0; m < 2 * d; ++m) inputs.push_back(Input(m, numel));
      std::vector<float> tree;
      Collectives::MemberOrderTreeSum(inputs, 0, 2 * d, &tree);
      for (int r = 0; r < 2 * d; ++r) EXPECT_EQ(fused[r], tree) << "fused member " << r;
      for (int r = 0; r < d; ++r) EXPECT_EQ(unfused[r], tree) << "unfused member " << r;
    }
  }
  // The tree's shape: (p0 + p1) + p2, and not p0 + (p1 + p2), on values
  // where the two differ.
  const std::vector<std::vector<float>> parts = {{1e8f}, {-1e8f}, {1.0f}};
  std::vector<float> sum;
  Collectives::MemberOrderTreeSum(parts, 0, 3, &sum);
  EXPECT_EQ(sum[0], 1.0f);
  const std::vector<std::vector<float>> other = {{1.0f}, {1e8f}, {-1e8f}};
  Collectives::MemberOrderTreeSum(other, 0, 3, &sum);
  EXPECT_EQ(sum[0], 0.0f);  // (1 + 1e8) rounds to 1e8
}

TEST(CollectivesTest, Broadcast_EveryRankGetsTheRootsTensor) {
  constexpr int n = 4;
  std::vector<std::vector<float>> got(n);
  const auto status = RunGroup(n, {}, [&](int r, Collectives& c) {
    Tensor t = Tensor::FromVector({50}, Input(r, 50));
    absl::Status s = c.Broadcast(1, 9, /*root=*/2, t);
    got[r] = t.ToVector();
    return s;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], Input(2, 50)) << "rank " << r;
  }
}

// Every member gets every member's tensor, in rank order and bitwise as
// sent, so the member-order sum of them (gradient clipping's global norm)
// is bitwise the same on every member; 1 to 5 members, in one message and
// in chunks (10 floats in 16-byte messages: three of four, the last short).
TEST(CollectivesTest, AllGatherSmall_EveryMemberGetsEveryTensor_SameSumBitwise) {
  for (const int64_t chunk_bytes : {int64_t{1} << 20, int64_t{16}}) {
    for (int n = 1; n <= 5; ++n) {
      SCOPED_TRACE(absl::StrCat(n, " members, ", chunk_bytes, "-byte messages"));
      std::vector<std::vector<std::vector<float>>> got(n);
      std::vector<std::vector<float>> sums(n);
      const CollectiveOptions options{chunk_bytes, 0, absl::Seconds(30)};
      const auto status = RunGroup(n, options, [&](int r, Collectives& c) {
        absl::StatusOr<std::vector<Tensor>> all =
            c.AllGatherSmall(/*iteration=*/2, /*tag=*/5, Tensor::FromVector({10}, Input(r, 10)));
        if (!all.ok()) return all.status();
        std::vector<float> sum(10, 0.0f);
        for (const Tensor& t : *all) {
          got[r].push_back(t.ToVector());
          for (int i = 0; i < 10; ++i) sum[i] += t.data()[i];
        }
        sums[r] = sum;
        return absl::OkStatus();
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
        ASSERT_EQ(got[r].size(), static_cast<size_t>(n)) << "rank " << r;
        for (int m = 0; m < n; ++m) {
          const std::vector<float> want = Input(m, 10);
          EXPECT_EQ(std::memcmp(got[r][m].data(), want.data(), 10 * sizeof(float)), 0)
              << "rank " << r << " got member " << m << "'s tensor altered";
        }
        EXPECT_EQ(std::memcmp(sums[r].data(), sums[0].data(), 10 * sizeof(float)), 0)
            << "rank " << r << "'s sum differs from rank 0's";
      }
    }
  }
}

// Records, for its member, how many messages it had sent when it first
// called a receive, and how many it sent in all.
class OrderRecordingTransport : public Transport {
 public:
  explicit OrderRecordingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    ++sent;
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    if (sent_before_first_receive < 0) sent_before_first_receive = sent;
    return inner_->RecvWire(peer, address, timeout);
  }
  // Written by this member's thread only; read once it is joined.
  int sent = 0;
  int sent_before_first_receive = -1;

 private:
  std::unique_ptr<Transport> inner_;
};

// One round, without timing: every member sends all its messages (one to
// each other member) before its first receive, so none waits for another's
// receive before it sends and the exchange costs one latency. (One
// Broadcast per root chains them: member r sends only after receiving
// roots 0..r-1, N latencies.)
TEST(CollectivesTest, AllGatherSmall_EveryMemberSendsAllBeforeItsFirstReceive) {
  constexpr int n = 4;
  InProcessFabric fabric(n);
  std::vector<std::unique_ptr<OrderRecordingTransport>> transports;
  for (int r = 0; r < n; ++r) {
    transports.push_back(std::make_unique<OrderRecordingTransport>(fabric.Connect(r)));
  }
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Collectives c(transports[r].get(), CollectiveGroup{{0, 1, 2, 3}, "j"});
      status[r] = c.AllGatherSmall(/*iteration=*/1, /*tag=*/3, Tensor::FromVector({6}, Input(r, 6)))
                      .status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(transports[r]->sent, n - 1) << "rank " << r;
    EXPECT_EQ(transports[r]->sent_before_first_receive, n - 1)
        << "rank " << r << " received before it had sent to every member";
  }
}

TEST(CollectivesTest, AllGatherSmall_MembersDisagreeOnTheSize_InternalNamingIt) {
  const auto status = RunGroup(3, {1 << 20, 0, absl::Seconds(5)}, [&](int r, Collectives& c) {
    return c.AllGatherSmall(1, 1, Tensor::Zeros({r == 1 ? 4 : 3})).status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInternal) << "rank " << r << ": " << status[r];
    EXPECT_TRUE(absl::StrContains(status[r].message(), "same sizes")) << status[r];
  }
}

TEST(CollectivesTest, BadGroup_InvalidArgument) {
  InProcessFabric fabric(3);
  std::unique_ptr<Transport> transport = fabric.Connect(1);
  EXPECT_EQ(Collectives(transport.get(), {{0, 2}, "j"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Collectives(transport.get(), {{0, 1, 1}, "j"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Collectives(transport.get(), {{}, "j"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectivesTest, MemberThatNeverJoins_DeadlineNamesTheCollective) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  Collectives c(transport.get(), {{0, 1}, "j"}, {1 << 20, 0, absl::Milliseconds(50)});
  Tensor t = Tensor::Zeros({100});
  const absl::Status s = c.AllReduce(1, 4, t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("collective 4 of group [0, 1] (rank 0)"), std::string::npos) << s;
}

TEST(CollectivesTest, MembersDisagreeOnTheSize_InternalNamingIt) {
  const auto status = RunGroup(2, {1 << 20, 0, absl::Seconds(5)}, [&](int r, Collectives& c) {
    Tensor t = Tensor::Zeros({r == 0 ? 10 : 12});
    return c.AllReduce(1, 1, t);
  });
  bool named = false;
  for (const absl::Status& s : status) {
    named = named || (s.code() == absl::StatusCode::kInternal &&
                      s.message().find("same sizes") != std::string::npos);
  }
  EXPECT_TRUE(named) << status[0] << " / " << status[1];
}

// A member whose transport sends its chunks fp16-encoded (a peer that does
// not follow the protocol): the raw collectives refuse an encoded chunk
// before decoding it, even one of the right size.
class EncodingTransport final : public Transport {
 public:
  explicit EncodingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    absl::StatusOr<std::string> payload = codec_->Encode(wire.tensor, nullptr);
    if (!payload.ok()) return payload.status();
    return inner_->SendWire(peer, address,
                            WireTensor::Encoded("fp16", *std::move(payload), wire.tensor.shape()));
  }
  absl::Status SendWireOwned(int peer, const TensorAddress& address, WireTensor wire) override {
    return SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return inner_->RecvWire(peer, address, timeout);
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::unique_ptr<Codec> codec_ = MakeFp16Codec();
};

TEST(CollectivesTest, EncodedChunkWhereRawIsDue_RefusedBeforeDecoding) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> honest = fabric.Connect(0);
  EncodingTransport encoding(fabric.Connect(1));
  const CollectiveOptions options{1 << 20, 0, absl::Seconds(5)};
  absl::Status peer_status;
  std::thread peer([&] {
    Collectives c(&encoding, {{0, 1}, "j"}, options);
    Tensor t = Tensor::Filled({10}, 1.0f);
    peer_status = c.AllReduce(1, 1, t);
  });
  Collectives c(honest.get(), {{0, 1}, "j"}, options);
  Tensor t = Tensor::Filled({10}, 2.0f);
  const absl::Status s = c.AllReduce(1, 1, t);
  peer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("member 1 sent 10 encoded values where 10 raw ones were due"),
            std::string::npos)
      << s;
}

// Members' inputs for the encoded all-reduce: `rows` x 16 values.
std::vector<float> EncodedInput(int member, int64_t rows, bool integers) {
  std::mt19937 random(2000 + member);
  std::vector<float> out(static_cast<size_t>(rows * 16));
  for (float& v : out) {
    v = integers ? float(int(random() % 201) - 100)
                 : std::uniform_real_distribution<float>(-3, 3)(random);
  }
  return out;
}

// Every member's EncodedInput (rows x 16) through AllReduceEncoded on n
// members with `options`: each member's result, stats and sent_bytes().
struct EncodedRun {
  std::vector<std::vector<float>> results;
  std::vector<Collectives::EncodedStats> stats;
  std::vector<int64_t> counted;
};

EncodedRun RunEncoded(int n, int64_t rows, bool integers, const Codec& codec,
                      const CollectiveOptions& options) {
  EncodedRun run{std::vector<std::vector<float>>(n), std::vector<Collectives::EncodedStats>(n),
                 std::vector<int64_t>(n)};
  const auto status = RunGroup(n, options, [&](int r, Collectives& c) {
    Tensor t = Tensor::FromVector({rows, 16}, EncodedInput(r, rows, integers));
    absl::Status s = c.AllReduceEncoded(2, 9, codec, rows, t, &run.stats[r]);
    run.results[r] = t.ToVector();
    run.counted[r] = c.sent_bytes();
    return s;
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
  return run;
}

// The payload bytes member r sends: phase 1, every other member's segment
// once; phase 2, its own summed segment to each of the n - 1 others; each
// segment in chunks of at most `chunk_rows` rows of 16 values. Two members
// exchange: each sends its whole tensor once, in such chunks.
int64_t ExpectedEncodedBytes(const Codec& codec, int64_t rows, int n, int r, int64_t chunk_rows) {
  int64_t expected = 0;
  if (n == 2) {
    for (int64_t b = 0; b < rows; b += chunk_rows) {
      expected += codec.EncodedBytes({std::min<int64_t>(chunk_rows, rows - b), 16});
    }
    return expected;
  }
  const auto bounds = Collectives::SegmentBounds(rows, n);
  for (int s = 0; s < n; ++s) {
    for (int64_t b = bounds[s].first; b < bounds[s].second; b += chunk_rows) {
      const int64_t bytes =
          codec.EncodedBytes({std::min<int64_t>(chunk_rows, bounds[s].second - b), 16});
      expected += s == r ? (n - 1) * bytes : bytes;
    }
  }
  return expected;
}

// Checks an fp16 run of small integers: the exact sum on every rank, the
// bytes sent (chunks of `chunk_rows`), no coding error.
void ExpectExactFp16Sums(const EncodedRun& run, const Codec& codec, int n, int64_t rows,
                         int64_t chunk_rows) {
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < run.results[r].size(); ++i) {
      float exact = 0;
      for (int m = 0; m < n; ++m) exact += EncodedInput(m, rows, true)[i];
      ASSERT_EQ(run.results[r][i], exact) << "n " << n << " rows " << rows << " rank " << r;
    }
    const int64_t expected = ExpectedEncodedBytes(codec, rows, n, r, chunk_rows);
    EXPECT_EQ(run.stats[r].sent_bytes, expected) << "n " << n << " rows " << rows << " rank " << r;
    EXPECT_EQ(run.counted[r], expected);
    EXPECT_EQ(run.stats[r].error_squared, 0.0);
    double norm = 0;
    for (float v : EncodedInput(r, rows, true)) norm += double(v) * v;
    EXPECT_EQ(run.stats[r].norm_squared, norm);
  }
}

// Piecewise quantization (acctfm eq. 6-12) with N clusters errs by at most
// half the widest interval, U_{N-1} / 2 = M / (2N), per value it encodes: each
// contribution once (M its member's largest magnitude) and the sum once more
// (its largest magnitude at most the sum of the members' M). Every rank must
// still hold bitwise the same result. Returns the largest error.
double ExpectPiecewiseWithinBound(const EncodedRun& run, int n, int64_t rows, int bits) {
  double max_sum = 0;
  for (int m = 0; m < n; ++m) {
    float max_of = 0;
    for (float v : EncodedInput(m, rows, false)) max_of = std::max(max_of, std::fabs(v));
    max_sum += max_of;
  }
  const double bound = (max_sum + max_sum) / (2.0 * bits) * (1 + 1e-5);
  double worst = 0;
  for (size_t i = 0; i < run.results[0].size(); ++i) {
    double exact = 0;
    for (int m = 0; m < n; ++m) exact += EncodedInput(m, rows, false)[i];
    const double diff = std::fabs(run.results[0][i] - exact);
    // A NaN is infinitely far: std::max would drop it (it compares false).
    worst = std::max(worst, std::isfinite(diff) ? diff : INFINITY);
    for (int r = 1; r < n; ++r) EXPECT_EQ(run.results[r][i], run.results[0][i]) << r << " " << i;
  }
  EXPECT_LE(worst, bound);
  for (int r = 0; r < n; ++r) {
    EXPECT_GT(run.stats[r].error_squared, 0.0);
    EXPECT_LT(run.stats[r].error_squared, run.stats[r].norm_squared);
  }
  return worst;
}

// Error feedback loses nothing: over all members, the coding errors add
// up to what the result lacks of the exact sum. With three or more members
// the summed segments are encoded a second time; that error too must be
// some member's (it was no one's: a quantizer's feedback lost about as
// much every step as one member's error). Also in rounds of two rows (the
// errors land at each round's own rows, and the stats add up the rounds).
TEST(CollectivesTest, EncodedAllReduce_CodingErrorsAddUpToWhatTheResultLacks) {
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(2);
  constexpr int64_t kRows = 9;
  CollectiveOptions in_rounds;
  in_rounds.exchange_bytes = 16 * 4;         // messages of one row
  in_rounds.exchange_window_bytes = 16 * 4;  // rounds of kExchangeWindowsAhead (2) rows
  for (const CollectiveOptions& options : {CollectiveOptions{}, in_rounds})
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat(n, " members, ", options.exchange_window_bytes, "-byte windows"));
      std::vector<std::vector<float>> results(n), errors(n);
      std::vector<Collectives::EncodedStats> stats(n);
      std::vector<int64_t> sent(n);
      const auto status = RunGroup(n, options, [&](int r, Collectives& c) {
        Tensor t = Tensor::FromVector({kRows, 16}, EncodedInput(r, kRows, false));
        Tensor error;
        absl::Status s = c.AllReduceEncoded(2, 9, *codec, kRows, t, &stats[r], &error);
        results[r] = t.ToVector();
        errors[r] = error.ToVector();
        sent[r] = c.sent_bytes();
        return s;
      });
      for (const absl::Status& s : status) ASSERT_TRUE(s.ok()) << s;
      // The stats cover every round: the whole contribution's norm, all
      // bytes sent, and (two members: no second encoding) the whole
      // coding error's norm.
      for (int r = 0; r < n; ++r) {
        double norm = 0, error = 0;
        for (float v : EncodedInput(r, kRows, false)) norm += double(v) * v;
        for (float v : errors[r]) error += double(v) * v;
        EXPECT_NEAR(stats[r].norm_squared, norm, 1e-9 * norm) << "member " << r;
        EXPECT_EQ(stats[r].sent_bytes, sent[r]) << "member " << r;
        if (n == 2) EXPECT_NEAR(stats[r].error_squared, error, 1e-6 * error) << "member " << r;
      }
      double worst = 0, lacking = 0;
      for (size_t i = 0; i < results[0].size(); ++i) {
        double exact = 0, fed_back = 0;
        for (int m = 0; m < n; ++m) {
          exact += EncodedInput(m, kRows, false)[i];
          fed_back += errors[m][i];
        }
        const double diff = std::fabs(results[0][i] + fed_back - exact);
        // A NaN is infinitely far: std::max would drop it (it compares false).
        worst = std::max(worst, std::isfinite(diff) ? diff : INFINITY);
        lacking = std::max(lacking, std::fabs(results[0][i] - exact));
      }
      EXPECT_GT(lacking, 0.1);  // the codec does drop something
      EXPECT_LT(worst, 1e-5);
    }
}

// fp16 carries small integers exactly, so the encoded all-reduce must give
// the exact sum; and it must split 7 rows unevenly over 2-4 members.
TEST(CollectivesTest, EncodedAllReduce_LosslessCodec_ExactSumOnEveryRank_BytesCounted) {
  std::unique_ptr<Codec> codec = MakeFp16Codec();
  for (int n : {2, 3, 4}) {
    ExpectExactFp16Sums(RunEncoded(n, 7, true, *codec, {}), *codec, n, 7, /*chunk_rows=*/7);
  }
}

// Two members exchange once: each ends with its contribution and the
// other's, each through the codec once, summed in member order, and not
// quantized again (AccTFM's recursive doubling).
TEST(CollectivesTest, EncodedAllReduce_TwoMembers_TheSumOfTheQuantizedContributions) {
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(3);
  const EncodedRun run = RunEncoded(2, 10, false, *codec, {});
  std::vector<std::vector<float>> through(2);
  for (int m = 0; m < 2; ++m) {
    const Tensor x = Tensor::FromVector({10, 16}, EncodedInput(m, 10, false));
    through[m] = (*codec->Decode(*codec->Encode(x, nullptr))).ToVector();
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(run.results[r].size(), through[0].size());
    for (size_t i = 0; i < through[0].size(); ++i) {
      ASSERT_EQ(run.results[r][i], through[0][i] + through[1][i]) << "rank " << r << " " << i;
    }
  }
}

TEST(CollectivesTest, EncodedAllReduce_Piecewise_WithinTheQuantizationBound_BitwiseEqual) {
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(3);
  const double worst = ExpectPiecewiseWithinBound(RunEncoded(3, 10, false, *codec, {}), 3, 10, 3);
  EXPECT_GT(worst, 0.0);  // 3-bit codes do lose something
}

// Segments go in chunks of whole rows (chunk_bytes of fp32 at most): with
// chunks of 3 rows of 16 values, 37 rows make several chunks per segment
// on 2-4 members, and 2 rows on 3 members leave one segment empty. fp16
// carries the integers exactly, so every rank holds the exact sum, and the
// bytes are the chunks' payloads. Piecewise codes each chunk by its own
// range, within the same bound as a whole segment (a chunk's largest
// magnitude is at most its segment's), bitwise equal on every rank.
TEST(CollectivesTest, EncodedAllReduce_InChunks_ExactWithFp16PiecewiseWithinItsBound) {
  const CollectiveOptions chunked{/*chunk_bytes=*/3 * 16 * 4, 0, absl::Seconds(10)};
  std::unique_ptr<Codec> fp16 = MakeFp16Codec();
  for (int n : {2, 3, 4}) {
    for (int64_t rows : {int64_t{37}, int64_t{2}}) {
      ExpectExactFp16Sums(RunEncoded(n, rows, true, *fp16, chunked), *fp16, n, rows,
                          /*chunk_rows=*/3);
    }
  }
  std::unique_ptr<Codec> piecewise = *MakePiecewiseCodec(3);
  const EncodedRun run = RunEncoded(3, 37, false, *piecewise, chunked);
  ExpectPiecewiseWithinBound(run, 3, 37, 3);
  // Each chunk's payload has its own header (the cluster boundaries), so
  // the bytes tell the chunks from one payload per segment.
  ASSERT_GT(ExpectedEncodedBytes(*piecewise, 37, 3, 0, 3),
            ExpectedEncodedBytes(*piecewise, 37, 3, 0, 37));
  EXPECT_EQ(run.stats[0].sent_bytes, ExpectedEncodedBytes(*piecewise, 37, 3, 0, 3));
}

// The encoded all-reduce goes in rounds as the ring does. `members`
// members, the last joining once the others wait for it, over a tensor of
// about ten rounds (512 KiB of fp32 each): each member's fp16 payloads
// waiting at the others stay within about a round's fp32 bytes (a round's
// payloads, and chunks in flight), not what one exchange of the whole
// tensor left waiting (the whole payload with two members, a third of it
// per peer and phase with three: over 1.4 MB each); and every member holds
// the exact sums (fp16 carries the integers and their sums exactly).
void ExpectEncodedLateMemberWithinARound(int members) {
  constexpr int64_t kRows = 80000;  // of 16 values: 5.12 MB of fp32
  CollectiveOptions options;
  options.chunk_bytes = int64_t{64} << 10;
  options.exchange_bytes = int64_t{64} << 10;
  options.exchange_window_bytes = int64_t{256} << 10;
  InProcessFabric fabric(members);
  InFlight in_flight;
  Blocked blocked;
  std::vector<std::unique_ptr<CountingTransport>> counting;
  std::vector<std::unique_ptr<ProbingTransport>> transports;
  CollectiveGroup group{{}, "j"};
  for (int r = 0; r < members; ++r) {
    counting.push_back(std::make_unique<CountingTransport>(fabric.Connect(r), &in_flight));
    transports.push_back(std::make_unique<ProbingTransport>(counting.back().get(), &blocked));
    group.members.push_back(r);
  }
  const std::unique_ptr<Codec> codec = MakeFp16Codec();
  std::vector<std::vector<float>> got(members);
  std::vector<absl::Status> status(members);
  const auto run = [&](int r) {
    Collectives c(transports[r].get(), group, options);
    Tensor t = Tensor::FromVector({kRows, 16}, EncodedInput(r, kRows, /*integers=*/true));
    status[r] = c.AllReduceEncoded(/*iteration=*/3, /*tag=*/1, *codec, kRows, t);
    got[r] = t.ToVector();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r + 1 < members; ++r) threads.emplace_back(run, r);
  EXPECT_TRUE(blocked.AwaitWaiting(members - 1));  // on, to end the threads, if not
  threads.emplace_back(run, members - 1);
  for (std::thread& t : threads) t.join();
  const int64_t round_bytes = kExchangeWindowsAhead * options.exchange_window_bytes;
  for (int r = 0; r < members; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
    EXPECT_LE(in_flight.most(r), round_bytes + 2 * options.chunk_bytes) << "member " << r;
  }
  std::vector<float> exact(got[0].size(), 0.0f);
  for (int m = 0; m < members; ++m) {
    const std::vector<float> input = EncodedInput(m, kRows, /*integers=*/true);
    for (size_t i = 0; i < exact.size(); ++i) exact[i] += input[i];
  }
  EXPECT_EQ(got[0], exact);
}

TEST(CollectivesTest, Encoded_TwoMembersLateOne_AtMostAboutOneRoundWaitsForIt) {
  ExpectEncodedLateMemberWithinARound(2);
}

TEST(CollectivesTest, Encoded_ThreeMembersLateOne_AtMostAboutOneRoundWaitsForIt) {
  ExpectEncodedLateMemberWithinARound(3);
}

// AllReduceEncoded of n members' EncodedInput (10 rows of 16, in chunks of
// 3 rows), each changed by `alter(r, values)`: INVALID_ARGUMENT on every
// member, its message containing `refusal`; then a second call of the same
// members with their inputs unchanged runs clean (nothing left in flight).
void ExpectEveryMemberRefusesThenGoesOn(int n, const Codec& codec,
                                        const std::function<void(int, std::vector<float>&)>& alter,
                                        const std::string& refusal) {
  const CollectiveOptions chunked{/*chunk_bytes=*/3 * 16 * 4, 0, absl::Seconds(60)};
  constexpr int64_t kRows = 10;
  std::vector<absl::Status> next(n);
  const auto status = RunGroup(n, chunked, [&](int r, Collectives& c) {
    std::vector<float> values = EncodedInput(r, kRows, false);
    alter(r, values);
    Tensor t = Tensor::FromVector({kRows, 16}, values);
    absl::Status s = c.AllReduceEncoded(2, 9, codec, kRows, t);
    Tensor again = Tensor::FromVector({kRows, 16}, EncodedInput(r, kRows, false));
    next[r] = c.AllReduceEncoded(3, 9, codec, kRows, again);
    return s;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << r << ": " << status[r];
    EXPECT_TRUE(absl::StrContains(status[r].message(), refusal)) << status[r];
    EXPECT_TRUE(next[r].ok()) << r << ": " << next[r];
  }
}

// No codec takes NaN or infinity. A member whose chunk is not finite (or
// whose sum overflows) sends it raw; every member meets it and all refuse
// alike once every message is exchanged, at once, where the others waited
// out their receive timeout (60 s here) for a chunk never sent. The next
// call of the same members then runs clean: nothing was left in flight.
TEST(CollectivesTest, EncodedAllReduce_NotFinite_EveryMemberRefusesAlikeAtOnce) {
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(3);
  for (int n : {2, 3, 4}) {
    for (const bool overflow : {false, true}) {
      SCOPED_TRACE(absl::StrCat(n, " members", overflow ? ", a sum that overflows" : ", a NaN"));
      ExpectEveryMemberRefusesThenGoesOn(
          n, *codec,
          [&](int r, std::vector<float>& values) {
            if (overflow) {
              values[100] = 3e38f;  // finite on each member, infinite summed
            } else if (r == n - 1) {
              values[100] = std::nanf("");
            }
          },
          "not finite");
    }
  }
}

// Finite values the codec refuses (fp16 carries at most 65504): one
// member's contribution, or, with three or more, a sum a member re-encodes,
// or a sum of a refused value that fp16 would carry. The refused chunk
// travels raw, exactly, and the call succeeds on every member with the same
// bits; what the result lacks of the exact sum (small integers otherwise,
// which fp16 carries exactly) is only what a re-encoded sum rounded, and
// that is in the summing member's coding error. It was INVALID_ARGUMENT
// ("training diverged?"), and only with three or more members for a sum
// past 65504 of values each fp16 carries: whether a job failed depended on
// its replica count.
TEST(CollectivesTest, EncodedAllReduce_CodecRefusesFiniteValues_TheyGoRawAndTheSumIsExact) {
  std::unique_ptr<Codec> codec = MakeFp16Codec();
  const CollectiveOptions chunked{/*chunk_bytes=*/3 * 16 * 4, 0, absl::Seconds(60)};
  constexpr int64_t kRows = 10;
  for (int n : {2, 3, 4}) {
    for (const int kind : {0, 1, 2}) {
      SCOPED_TRACE(absl::StrCat(n, " members",
                                kind == 0   ? ", a value past fp16"
                                : kind == 1 ? ", values fp16 carries summed past it"
                                            : ", a value past fp16 summed to one it carries"));
      const auto input = [&](int r) {
        std::vector<float> values = EncodedInput(r, kRows, true);
        if (kind == 1) {
          values[100] = 30000.0f;
        } else if (r == n - 1) {
          values[100] = 70000.0f;
        } else if (kind == 2 && r == 0) {
          values[100] = -10000.0f;
        }
        return values;
      };
      std::vector<std::vector<float>> results(n), errors(n);
      std::vector<absl::Status> next(n);
      const auto status = RunGroup(n, chunked, [&](int r, Collectives& c) {
        Tensor t = Tensor::FromVector({kRows, 16}, input(r));
        Tensor error;
        absl::Status s = c.AllReduceEncoded(2, 9, *codec, kRows, t, nullptr, &error);
        results[r] = t.ToVector();
        errors[r] = error.ToVector();
        Tensor again = Tensor::FromVector({kRows, 16}, EncodedInput(r, kRows, true));
        next[r] = c.AllReduceEncoded(3, 9, *codec, kRows, again);
        return s;
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(status[r].ok()) << r << ": " << status[r];
        EXPECT_TRUE(next[r].ok()) << r << ": " << next[r];
        EXPECT_EQ(results[r], results[0]) << "member " << r;
      }
      for (size_t i = 0; i < results[0].size(); ++i) {
        float exact = 0, fed_back = 0;
        for (int m = 0; m < n; ++m) {
          exact += input(m)[i];
          fed_back += errors[m][i];
        }
        // Integers all (fp16 rounds 59937 to 59936): exact in fp32.
        ASSERT_EQ(results[0][i] + fed_back, exact) << "value " << i;
        // Two members never re-encode a sum: nothing is lost.
        if (n == 2) ASSERT_EQ(results[0][i], exact) << "value " << i;
      }
      // The refused contribution went raw: no coding error of its own.
      if (kind != 1) EXPECT_EQ(errors[n - 1][100], 0.0f);
    }
  }
}

// A tensor of no values (rows of width 0) has nothing to sum: OK at once on
// every member, nothing sent, stats zero and a coding error of data's shape.
TEST(CollectivesTest, EncodedAllReduce_NoValues_OkNothingSentStatsZero) {
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(3);
  for (int n : {1, 2, 3}) {
    std::vector<Collectives::EncodedStats> stats(n, {7, 1.0, 1.0});
    std::vector<Tensor> errors(n, Tensor::Zeros({1}));
    std::vector<int64_t> sent(n, -1);
    const auto status = RunGroup(n, {1 << 20, 0, absl::Seconds(5)}, [&](int r, Collectives& c) {
      Tensor t = Tensor::Zeros({4, 0});
      absl::Status s = c.AllReduceEncoded(1, 1, *codec, 4, t, &stats[r], &errors[r]);
      sent[r] = c.sent_bytes();
      return s;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(status[r].ok()) << status[r];
      EXPECT_EQ(sent[r], 0);
      EXPECT_EQ(stats[r].sent_bytes, 0);
      EXPECT_EQ(stats[r].norm_squared, 0.0);
      EXPECT_EQ(stats[r].error_squared, 0.0);
      EXPECT_EQ(errors[r].shape(), (Shape{4, 0}));
    }
  }
}

// A tensor marked as a device's (its storage is host memory here, so that
// a collective that wrongly read it would not crash but wait for the
// member that never comes).
Tensor FakeDeviceTensor(int64_t numel) {
  std::shared_ptr<float> storage(new float[numel](), std::default_delete<float[]>());
  return Tensor::OnDevice({numel}, storage);
}

TEST(CollectivesTest, DeviceTensors_EveryCallRefusedBeforeSendingAnything) {
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  Collectives c(transport.get(), {{0, 1}, "j"}, {1 << 20, 0, absl::Milliseconds(200)});
  ASSERT_TRUE(c.status().ok()) << c.status();
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(3);
  Tensor t = FakeDeviceTensor(8);
  Tensor half = FakeDeviceTensor(4);  // rank 0's segment of 8
  const std::vector<std::pair<std::string, absl::Status>> calls = {
      {"AllReduce", c.AllReduce(1, 1, t)},
      {"AllReduceInMemberOrder", c.AllReduceInMemberOrder(1, 2, t)},
      {"AllReduceEncoded", c.AllReduceEncoded(1, 3, *codec, 1, t)},
      {"ReduceScatter", c.ReduceScatter(1, 4, t).status()},
      {"AllGather", c.AllGather(1, 5, half, 8).status()},
      {"Gather", c.Gather(1, 6, /*root=*/1, half, 8).status()},
      {"Broadcast (root)", c.Broadcast(1, 7, /*root=*/0, t)},
      {"Broadcast", c.Broadcast(1, 8, /*root=*/1, t)},
      {"AllGatherSmall", c.AllGatherSmall(1, 9, t).status()},
  };
  for (const auto& [name, status] : calls) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "is on a device")) << name << ": " << status;
  }
  EXPECT_EQ(c.sent_bytes(), 0);
}

TEST(CollectivesTest, EncodedAllReduce_MembersDisagreeOnTheRows_InternalNamingIt) {
  std::unique_ptr<Codec> codec = *MakePiecewiseCodec(3);
  const auto status = RunGroup(2, {1 << 20, 0, absl::Seconds(5)}, [&](int r, Collectives& c) {
    Tensor t = Tensor::Zeros({8, 4});
    return c.AllReduceEncoded(1, 1, *codec, r == 0 ? 8 : 4, t);
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("member"), std::string::npos) << s;
  }
  Tensor t = Tensor::Zeros({7});
  InProcessFabric fabric(1);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  Collectives c(transport.get(), {{0}, "j"});
  EXPECT_EQ(c.AllReduceEncoded(1, 1, *codec, 2, t).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
