// All-reduce over the gRPC data plane, nccl-tests style (issue 21): N
// members, each its own process (default; --threads: threads of one
// process) with its own data-plane server, mailbox and GrpcTransport,
// talking over loopback (optionally through link emulation: --emulate-link
// 1Gbit,0.5ms). Per size: the time of one all-reduce (the slowest rank's
// mean over --iters), algbw = bytes / time, busbw = algbw * 2 (N-1) / N (the
// bytes each link carries per second in a ring), and a check that every rank
// holds the exact sum. Next to it, the point-to-point rate of the same data
// plane (member 0 streaming 16 MiB tensors to member 1, at its best: handed
// over without a copy) measured by the same program, and the rate of the
// same streams when every member sends to the next at once (the ring's
// traffic without the all-reduce: what the links, or one host's cores,
// carry when all are busy). With --codec Q (a
// quantizer: fp16, bf16, linear:bits=N, piecewise:bits=N) the all-reduce is
// Collectives::AllReduceEncoded with each member's coding error kept, as a
// data-parallel stage compressed by Q runs it; sizes and bandwidths stay
// those of the fp32 tensor, and the check allows 1 % error.
//
// Processes: the parent forks the members before it touches gRPC, learns
// their data-plane ports through pipes, hands every member the address
// list, and collects each member's per-size results, one line each.
//
//   bazel run -c opt //worker/collectives:collective_benchmark -- --members 4 [--max-mib 256]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/flag_set.h"
#include "common/malloc_tuning.h"
#include "kernels/compress/codec_spec.h"
#include "worker/agent/device_info.h"
#include "worker/collectives/collectives.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/grpc_transport.h"
#include "worker/transport/shaped_transport.h"
#include "worker/transport/tensor_pool.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kP2PBytes = int64_t{16} << 20;
constexpr int kP2PCount = 16;
constexpr absl::Duration kPatience = absl::Seconds(300);

double Since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

struct Settings {
  int members = 2;
  int max_mib = 256;
  int iters = 5;
  std::optional<LinkModel> link;
  std::string codec;     // empty: exact
  int chunk_kib = 1024;  // CollectiveOptions::chunk_bytes
  int exchange_kib = 256;  // CollectiveOptions::exchange_bytes
};

std::vector<int64_t> Sizes(const Settings& s) {
  std::vector<int64_t> sizes;
  for (int64_t bytes = 4096; bytes <= (int64_t{s.max_mib} << 20); bytes *= 4) {
    sizes.push_back(bytes);
  }
  return sizes;
}

// One member: its data-plane server (started first, to learn its port),
// then its transport once every member's address is known.
struct Member {
  Mailbox mailbox;
  std::unique_ptr<DataPlaneServer> server;
  std::unique_ptr<Transport> transport;

  void Start(int members) {
    server = DataPlaneServer::Start("127.0.0.1:0", &mailbox).value();
    server->SetJob("bench", members, "");  // loopback benchmark: no proof needed
  }
  void Connect(int rank, const std::vector<std::string>& addresses,
               const std::optional<LinkModel>& link) {
    GrpcTransportOptions options;
    options.credential = {"bench", {}};  // the servers hold no keys
    transport.reset(new GrpcTransport(rank, addresses, &mailbox, std::move(options)));
    if (link.has_value()) transport.reset(new ShapedTransport(std::move(transport), *link));
  }
  // First every member's sending side (so no stream sees its peer vanish),
  // then the receiving side.
  void StopSending() {
    if (transport == nullptr) return;
    if (auto* grpc = dynamic_cast<GrpcTransport*>(transport.get())) grpc->Shutdown();
    transport.reset();  // a ShapedTransport delivers its queue, then shuts down
  }
  void StopReceiving() {
    server->Shutdown();
    mailbox.Shutdown();
  }
};

TensorAddress P2PAddress(int i) { return {"bench", 1000000 + i, v1::TENSOR_KIND_ACTIVATION, 0, 0}; }

// A pool for one stream's tensors, so that freeing them once sent is not
// timed, and kP2PCount tensors of kP2PBytes from it, made before a clock
// starts.
std::shared_ptr<TensorPool> StreamPool() {
  return TensorPool::Create({.max_cached_bytes = kP2PBytes * (kP2PCount + 1)});
}

std::vector<Tensor> StreamTensors(TensorPool& pool) {
  std::vector<Tensor> outgoing;
  for (int i = 0; i < kP2PCount; ++i) {
    outgoing.push_back(pool.Take({kP2PBytes / 4}));
    outgoing.back().Fill(1.0f);
  }
  return outgoing;
}

// Point-to-point, sender side (member 0 to member 1): tensors made before the
// clock starts and handed over (SendOwned: no copy), from a pool so that
// freeing them once sent is not timed; the clock stops at member 1's
// one-value acknowledgement of the last one. GB/s of payload.
double PointToPointSend(Transport& t) {
  std::shared_ptr<TensorPool> pool = StreamPool();
  std::vector<Tensor> outgoing = StreamTensors(*pool);
  const auto start = Clock::now();
  for (int i = 0; i < kP2PCount; ++i) {
    if (!t.SendOwned(1, P2PAddress(i), std::move(outgoing[i])).ok()) std::abort();
  }
  if (!t.Recv(1, P2PAddress(kP2PCount), kPatience).ok()) std::abort();
  return double(kP2PBytes) * kP2PCount / Since(start) / 1e9;
}

void PointToPointReceive(Transport& t) {
  for (int i = 0; i < kP2PCount; ++i) {
    if (!t.Recv(0, P2PAddress(i), kPatience).ok()) std::abort();
  }
  if (!t.Send(0, P2PAddress(kP2PCount), Tensor::Zeros({1})).ok()) std::abort();
}

// The ring's traffic with nothing added: every member streams kP2PCount
// 16 MiB tensors to the next one, (rank + 1) % members, while it receives
// the previous one's, all at once (after a one-value all-reduce as a
// barrier). This is what the links carry per direction when all of them
// are busy; on one host, what its cores let them carry (one lone stream,
// PointToPointSend, may have the cores to itself). Per round of
// kStreamRounds, GB/s of payload of this member's incoming stream: the
// bytes over the time to its last receipt. (Where members outnumber cores
// the streams share them unevenly, and a round's slowest stream varies a
// lot: the caller takes the best round.)
constexpr int kStreamRounds = 3;

std::vector<double> ConcurrentStreams(Transport& t, int rank, int members) {
  std::vector<int> ranks(members);
  for (int i = 0; i < members; ++i) ranks[i] = i;
  Collectives barrier(&t, {ranks, "bench"});
  std::shared_ptr<TensorPool> pool = StreamPool();
  const int next = (rank + 1) % members, previous = (rank + members - 1) % members;
  std::vector<double> rates;
  for (int round = 0; round < kStreamRounds; ++round) {
    std::vector<Tensor> outgoing = StreamTensors(*pool);
    Tensor one = Tensor::Zeros({1});
    // Iterations of their own: RunMember's all-reduces are iteration 0.
    if (!barrier.AllReduce(/*iteration=*/(1 << 20) + round, /*tag=*/0, one).ok()) std::abort();
    auto address = [&](int i) {
      return TensorAddress{"bench", 2000000 + round * kP2PCount + i, v1::TENSOR_KIND_ACTIVATION, 0,
                           0};
    };
    const auto start = Clock::now();
    for (int i = 0; i < kP2PCount; ++i) {
      if (!t.SendOwned(next, address(i), std::move(outgoing[i])).ok()) std::abort();
    }
    for (int i = 0; i < kP2PCount; ++i) {
      if (!t.Recv(previous, address(i), kPatience).ok()) std::abort();
    }
    rates.push_back(double(kP2PBytes) * kP2PCount / Since(start) / 1e9);
  }
  return rates;
}

// The best round's slowest stream, from each member's ConcurrentStreams.
double BestRoundsSlowestStream(const std::vector<std::vector<double>>& by_member) {
  double best = 0;
  for (int round = 0; round < kStreamRounds; ++round) {
    double slowest = INFINITY;
    for (const std::vector<double>& rates : by_member) slowest = std::min(slowest, rates[round]);
    best = std::max(best, slowest);
  }
  return best;
}

struct SizeResult {
  double seconds = 0;  // summed over the timed iterations
  bool exact = true;
};

// Rank `rank`'s all-reduces: per size, one warm-up then `iters` timed ones.
std::vector<SizeResult> RunMember(Transport& t, int rank, const Settings& s) {
  std::vector<int> ranks(s.members);
  for (int i = 0; i < s.members; ++i) ranks[i] = i;
  CollectiveOptions options;
  options.chunk_bytes = int64_t{s.chunk_kib} << 10;
  options.exchange_bytes = int64_t{s.exchange_kib} << 10;
  Collectives c(&t, {ranks, "bench"}, options);
  std::unique_ptr<Codec> codec;
  if (!s.codec.empty()) codec = MakeQuantizer(s.codec).value();  // checked by Run
  std::vector<SizeResult> results;
  int tag = 0;
  for (int64_t bytes : Sizes(s)) {
    const int64_t numel = bytes / 4;
    // Exact in fp32: sum of (rank + 1) * 0.5 is a multiple of 0.5 far below 2^24.
    Tensor data = Tensor::Filled({numel}, (rank + 1) * 0.5f);
    const float want = 0.25f * s.members * (s.members + 1);
    SizeResult result;
    for (int i = 0; i <= s.iters; ++i) {
      data.Fill((rank + 1) * 0.5f);
      const auto start = Clock::now();
      if (codec == nullptr) {
        if (!c.AllReduce(/*iteration=*/0, tag++, data).ok()) std::abort();
      } else {
        Tensor coding_error;
        if (!c.AllReduceEncoded(/*iteration=*/0, tag++, *codec, numel, data, nullptr, &coding_error)
                 .ok()) {
          std::abort();
        }
      }
      if (i > 0) result.seconds += Since(start);
      const float slack = codec == nullptr ? 0.0f : 0.01f * want;
      auto close = [&](float x) { return std::fabs(x - want) <= slack; };
      for (int64_t k = 0; k < numel; k += 997) result.exact = result.exact && close(data[k]);
      result.exact = result.exact && close(data[numel - 1]);
    }
    results.push_back(result);
  }
  return results;
}

// --- the group as threads of this process ---------------------------------

struct GroupResults {
  double p2p = 0;
  double streams = 0;  // BestRoundsSlowestStream
  std::vector<std::vector<SizeResult>> by_rank;
};

GroupResults RunThreads(const Settings& s) {
  std::vector<std::unique_ptr<Member>> members;
  std::vector<std::string> addresses;
  for (int r = 0; r < s.members; ++r) {
    members.push_back(std::make_unique<Member>());
    members.back()->Start(s.members);
    addresses.push_back(members.back()->server->address());
  }
  for (int r = 0; r < s.members; ++r) members[r]->Connect(r, addresses, s.link);
  GroupResults out;
  std::thread receiver([&] { PointToPointReceive(*members[1]->transport); });
  out.p2p = PointToPointSend(*members[0]->transport);
  receiver.join();
  std::vector<std::vector<double>> streams(s.members);
  std::vector<std::thread> streamers;
  for (int r = 0; r < s.members; ++r) {
    streamers.emplace_back(
        [&, r] { streams[r] = ConcurrentStreams(*members[r]->transport, r, s.members); });
  }
  for (std::thread& t : streamers) t.join();
  out.streams = BestRoundsSlowestStream(streams);
  out.by_rank.resize(s.members);
  std::vector<std::thread> threads;
  for (int r = 0; r < s.members; ++r) {
    threads.emplace_back([&, r] { out.by_rank[r] = RunMember(*members[r]->transport, r, s); });
  }
  for (std::thread& t : threads) t.join();
  for (auto& m : members) m->StopSending();
  for (auto& m : members) m->StopReceiving();
  return out;
}

// --- the group as processes --------------------------------------------------

// Line-oriented pipes between the parent and one child.
struct Pipe {
  FILE* in = nullptr;   // what the other side wrote
  FILE* out = nullptr;  // to the other side
};

std::string ReadLine(FILE* in) {
  std::string line;
  for (int c = std::fgetc(in); c != EOF && c != '\n'; c = std::fgetc(in)) line.push_back(c);
  return line;
}

// In the child: start, report the port, wait for the addresses, run, report
// "p2p <GB/s>" (rank 0), "streams <GB/s>" and one "<seconds> <exact>" line
// per size.
[[noreturn]] void ChildMain(int rank, const Settings& s, Pipe parent) {
  Member m;
  m.Start(s.members);
  std::fprintf(parent.out, "%s\n", m.server->address().c_str());
  std::fflush(parent.out);
  const std::vector<std::string> addresses = absl::StrSplit(ReadLine(parent.in), ',');
  m.Connect(rank, addresses, s.link);
  if (rank == 0) std::fprintf(parent.out, "p2p %.6f\n", PointToPointSend(*m.transport));
  if (rank == 1) PointToPointReceive(*m.transport);
  std::fprintf(parent.out, "streams %s\n",
               absl::StrJoin(ConcurrentStreams(*m.transport, rank, s.members), " ").c_str());
  for (const SizeResult& r : RunMember(*m.transport, rank, s)) {
    std::fprintf(parent.out, "%.9f %d\n", r.seconds, r.exact ? 1 : 0);
  }
  std::fflush(parent.out);
  // Every member's last all-reduce needs this one's sends, so once all
  // report, nothing is in flight. The parent's "stop" closes the sending
  // side; its "exit", once every member has, the receiving side.
  (void)ReadLine(parent.in);
  m.StopSending();
  std::fprintf(parent.out, "stopped\n");
  std::fflush(parent.out);
  (void)ReadLine(parent.in);
  m.StopReceiving();
  std::_Exit(0);
}

GroupResults RunProcesses(const Settings& s) {
  std::vector<Pipe> children;
  std::vector<pid_t> pids;
  for (int r = 0; r < s.members; ++r) {
    int to_child[2], to_parent[2];
    if (pipe(to_child) != 0 || pipe(to_parent) != 0) std::abort();
    const pid_t pid = fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
      for (Pipe& p : children) {  // the earlier children's ends are not ours
        std::fclose(p.in);
        std::fclose(p.out);
      }
      close(to_child[1]);
      close(to_parent[0]);
      ChildMain(r, s, {fdopen(to_child[0], "r"), fdopen(to_parent[1], "w")});
    }
    close(to_child[0]);
    close(to_parent[1]);
    children.push_back({fdopen(to_parent[0], "r"), fdopen(to_child[1], "w")});
    pids.push_back(pid);
  }
  std::vector<std::string> addresses;
  for (Pipe& p : children) addresses.push_back(ReadLine(p.in));
  const std::string list = absl::StrJoin(addresses, ",");
  for (Pipe& p : children) {
    std::fprintf(p.out, "%s\n", list.c_str());
    std::fflush(p.out);
  }
  GroupResults out;
  const std::string p2p = ReadLine(children[0].in);
  if (!absl::SimpleAtod(absl::StripPrefix(p2p, "p2p "), &out.p2p)) std::abort();
  std::vector<std::vector<double>> streams;
  for (Pipe& p : children) {
    streams.emplace_back();
    const std::string line = ReadLine(p.in);
    for (absl::string_view field : absl::StrSplit(absl::StripPrefix(line, "streams "), ' ')) {
      double rate = 0;
      if (!absl::SimpleAtod(field, &rate)) std::abort();
      streams.back().push_back(rate);
    }
    if (streams.back().size() != kStreamRounds) std::abort();
  }
  out.streams = BestRoundsSlowestStream(streams);
  const size_t sizes = Sizes(s).size();
  out.by_rank.resize(s.members);
  for (int r = 0; r < s.members; ++r) {
    for (size_t i = 0; i < sizes; ++i) {
      const std::vector<std::string> fields = absl::StrSplit(ReadLine(children[r].in), ' ');
      SizeResult result;
      if (fields.size() != 2 || !absl::SimpleAtod(fields[0], &result.seconds)) std::abort();
      result.exact = fields[1] == "1";
      out.by_rank[r].push_back(result);
    }
  }
  for (const char* command : {"stop", "exit"}) {
    for (Pipe& p : children) {
      std::fprintf(p.out, "%s\n", command);
      std::fflush(p.out);
    }
    if (std::string(command) == "stop") {
      for (Pipe& p : children) (void)ReadLine(p.in);  // "stopped"
    }
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::abort();
  }
  return out;
}

int Run(const std::vector<std::string>& args) {
  Settings s;
  std::string emulate;
  bool threads = false;
  FlagSet flags(
      "usage: collective_benchmark [--members N] [--max-mib 256] [--iters 5] "
      "[--emulate-link BANDWIDTH,LATENCY] [--threads] [--codec QUANTIZER] "
      "[--chunk-kib 1024] [--exchange-kib 256]");
  flags.Int("members", &s.members, "group size (processes with a data plane each)");
  flags.Int("max-mib", &s.max_mib, "largest tensor, MiB (sizes from 4 KiB, x4 each)");
  flags.Int("iters", &s.iters, "timed all-reduces per size (after one warm-up)");
  flags.String("emulate-link", &emulate,
               "pace every send as over this link (see pipetrain-worker)");
  flags.Int("chunk-kib", &s.chunk_kib, "the ring's message size, KiB (CollectiveOptions)");
  flags.Int("exchange-kib", &s.exchange_kib,
            "recursive doubling's message size (two members), KiB (CollectiveOptions)");
  flags.Bool("threads", &threads, "members as threads of one process instead of processes");
  flags.String("codec", &s.codec,
               "a quantizer (fp16, bf16, linear:bits=N, piecewise:bits=N): the compressed "
               "all-reduce of a data-parallel stage instead of the exact one");
  const bool parsed = flags.Parse(args).ok();
  // Before anything forks: --help only prints.
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  const absl::StatusOr<std::optional<LinkModel>> link = ParseLinkModel("--emulate-link", emulate);
  const bool codec_ok = s.codec.empty() || MakeQuantizer(s.codec).ok();
  if (!parsed || !link.ok() || !codec_ok || s.members < 2 || s.iters < 1 || s.max_mib < 1 ||
      s.chunk_kib < 1 || s.exchange_kib < 1) {
    std::fprintf(stderr, "%s", flags.Usage().c_str());
    return 2;
  }
  s.link = *link;
  std::printf(
      "# all-reduce (sum, fp32) over the gRPC data plane: %d members (%s), %s; %s, %u hardware "
      "threads; links: %s; messages: ring <= %d KiB, exchange <= %d KiB\n",
      s.members, threads ? "threads of one process" : "one process each",
      s.codec.empty() ? "ring / recursive doubling"
                      : absl::StrCat("AllReduceEncoded through ", s.codec).c_str(),
      CpuModelName().c_str(), std::thread::hardware_concurrency(),
      emulate.empty() ? "loopback" : emulate.c_str(), s.chunk_kib,
      std::min(s.chunk_kib, s.exchange_kib));
  std::fflush(stdout);  // before fork: children must not inherit buffered output
  const GroupResults results = threads ? RunThreads(s) : RunProcesses(s);
  const double p2p = results.p2p;
  std::printf(
      "# point-to-point (member 0 -> 1, one GrpcTransport stream, 16 MiB tensors handed "
      "over): %.2f GB/s\n",
      p2p);
  const double streams = results.streams;
  std::printf(
      "# concurrent streams (every member to the next at once, the ring's traffic without "
      "the all-reduce; slowest stream of the best of %d rounds): %.2f GB/s\n",
      kStreamRounds, streams);
  std::printf("%12s %10s %10s %10s %8s %12s %7s\n", "size_B", "time_ms", "algbw_GBps", "busbw_GBps",
              "bus/p2p", "bus/streams", "check");
  // The goals, judged only on the sizes they name (from 16 MiB):
  // busbw >= 0.8 x point-to-point, and under emulation >= 0.9 x the link.
  constexpr int64_t kGoalFromBytes = int64_t{16} << 20;
  bool all_ok = true, goal = true, link_goal = true, goal_measured = false;
  const std::vector<int64_t> sizes = Sizes(s);
  for (size_t i = 0; i < sizes.size(); ++i) {
    double slowest = 0;
    bool row_ok = true;
    for (const auto& rank : results.by_rank) {
      slowest = std::max(slowest, rank[i].seconds);
      row_ok = row_ok && rank[i].exact;
    }
    const int64_t bytes = sizes[i];
    const double time = slowest / s.iters;
    const double algbw = bytes / time / 1e9;
    const double busbw = algbw * 2.0 * (s.members - 1) / s.members;
    all_ok = all_ok && row_ok;
    if (bytes >= kGoalFromBytes) {
      goal_measured = true;
      goal = goal && busbw >= 0.8 * p2p;
      if (s.link.has_value()) {
        link_goal = link_goal && busbw >= 0.9 * s.link->bandwidth_bytes_per_second / 1e9;
      }
    }
    std::printf("%12lld %10.3f %10.3f %10.3f %8.2f %12.2f %7s\n", static_cast<long long>(bytes),
                time * 1e3, algbw, busbw, busbw / p2p, busbw / streams, row_ok ? "OK" : "WRONG");
  }
  auto verdict = [&](bool met) {
    return !goal_measured ? "not measured (no size from 16 MiB: raise --max-mib)"
           : met          ? "met"
                          : "not met";
  };
  std::printf(
      "# check: %s; goal busbw >= 0.8 x point-to-point from 16 MiB up: %s\n",
      all_ok ? (s.codec.empty() ? "every rank exact" : "every rank within 1 %") : "WRONG RESULTS",
      verdict(goal));
  if (s.link.has_value()) {
    std::printf("# goal busbw >= 0.9 x the emulated link (%.3f GB/s) from 16 MiB up: %s\n",
                s.link->bandwidth_bytes_per_second / 1e9, verdict(link_goal));
  }
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::TuneMallocForLargeBuffers();  // As pipetrain-worker does.
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
