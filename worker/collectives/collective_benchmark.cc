// All-reduce over the gRPC data plane, nccl-tests style (issue 21): N
// members in one process, each with its own data-plane server, mailbox and
// GrpcTransport, talking over loopback (optionally through link emulation:
// --emulate-link 1Gbit,0.5ms). Per size: the time of one all-reduce (the
// slowest rank's mean over --iters), algbw = bytes / time, busbw = algbw *
// 2 (N-1) / N (the bytes each link carries per second in a ring), and a
// check that every rank holds the exact sum. Next to it, the point-to-point
// rate of the same data plane (one GrpcTransport streaming 16 MiB tensors
// to another) measured by the same program.
//
//   bazel run //worker/collectives:collective_benchmark -- --members 4 [--max-mib 256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "common/flag_set.h"
#include "worker/agent/device_info.h"
#include "worker/collectives/collectives.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/grpc_transport.h"
#include "worker/transport/shaped_transport.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

struct Member {
  Mailbox mailbox;
  std::unique_ptr<DataPlaneServer> server;
  std::unique_ptr<Transport> transport;
};

std::vector<std::unique_ptr<Member>> StartMembers(int n, const std::optional<LinkModel>& link) {
  std::vector<std::unique_ptr<Member>> members;
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    auto m = std::make_unique<Member>();
    m->server = DataPlaneServer::Start("127.0.0.1:0", &m->mailbox).value();
    m->server->SetJob("bench", n, "");  // one process: no proof needed
    addresses.push_back(m->server->address());
    members.push_back(std::move(m));
  }
  for (int i = 0; i < n; ++i) {
    GrpcTransportOptions options;
    options.credential = {"bench", ""};  // the servers hold no secret
    std::unique_ptr<Transport> t(
        new GrpcTransport(i, addresses, &members[i]->mailbox, std::move(options)));
    if (link.has_value()) t.reset(new ShapedTransport(std::move(t), *link));
    members[i]->transport = std::move(t);
  }
  return members;
}

// Point-to-point: member 0 streams `count` tensors of `bytes` to member 1.
double PointToPointGBps(std::vector<std::unique_ptr<Member>>& m, int64_t bytes, int count) {
  Tensor t = Tensor::Zeros({bytes / 4});
  const auto start = Clock::now();
  std::thread receiver([&] {
    for (int i = 0; i < count; ++i) {
      TensorAddress a{"bench", 1000000 + i, v1::ACTIVATION, 0, 0};
      if (!m[1]->transport->Recv(0, a, absl::Seconds(120)).ok()) std::abort();
    }
  });
  for (int i = 0; i < count; ++i) {
    TensorAddress a{"bench", 1000000 + i, v1::ACTIVATION, 0, 0};
    if (!m[0]->transport->Send(1, a, t).ok()) std::abort();
  }
  receiver.join();
  return double(bytes) * count / Since(start) / 1e9;
}

int Run(const std::vector<std::string>& args) {
  int members = 2, max_mib = 256, iters = 5;
  std::string emulate;
  FlagSet flags(
      "usage: collective_benchmark [--members N] [--max-mib 256] [--iters 5] "
      "[--emulate-link BANDWIDTH,LATENCY]");
  flags.Int("members", &members, "group size (threads with a data plane each)");
  flags.Int("max-mib", &max_mib, "largest tensor, MiB (sizes from 4 KiB, x4 each)");
  flags.Int("iters", &iters, "timed all-reduces per size (after one warm-up)");
  flags.String("emulate-link", &emulate,
               "pace every send as over this link (see pipetrain-worker)");
  const bool parsed = flags.Parse(args).ok();
  const absl::StatusOr<std::optional<LinkModel>> link = ParseLinkModel("--emulate-link", emulate);
  if (!parsed || !link.ok() || members < 2 || iters < 1 || max_mib < 1) {
    std::fprintf(stderr, "%s", flags.Usage().c_str());
    return 2;
  }
  auto group = StartMembers(members, *link);
  std::printf(
      "# all-reduce (sum, fp32) over the gRPC data plane: %d members, ring / recursive "
      "doubling; %s, %u hardware threads; links: %s\n",
      members, CpuModelName().c_str(), std::thread::hardware_concurrency(),
      emulate.empty() ? "loopback" : emulate.c_str());
  const double p2p = PointToPointGBps(group, 16 << 20, 16);
  std::printf("# point-to-point (one GrpcTransport stream, 16 MiB tensors): %.2f GB/s\n", p2p);
  std::printf("%12s %10s %10s %10s %8s %7s\n", "size_B", "time_ms", "algbw_GBps", "busbw_GBps",
              "bus/p2p", "check");
  std::vector<int> ranks(members);
  for (int i = 0; i < members; ++i) ranks[i] = i;
  int tag = 0;
  bool all_ok = true, goal = true;
  for (int64_t bytes = 4096; bytes <= (int64_t{max_mib} << 20); bytes *= 4) {
    const int64_t numel = bytes / 4;
    std::vector<double> seconds(members, 0);
    std::vector<bool> ok(members, true);
    const int first_tag = tag;
    tag += iters + 1;
    std::vector<std::thread> threads;
    for (int r = 0; r < members; ++r) {
      threads.emplace_back([&, r] {
        Collectives c(group[r]->transport.get(), {ranks, "bench"});
        // Exact in fp32: sum of (rank + 1) * 0.5 is a multiple of 0.5 far
        // below 2^24.
        Tensor data = Tensor::Filled({numel}, (r + 1) * 0.5f);
        const float want = 0.25f * members * (members + 1);
        for (int i = 0; i <= iters; ++i) {
          data.Fill((r + 1) * 0.5f);
          const auto start = Clock::now();
          if (!c.AllReduce(/*iteration=*/0, first_tag + i, data).ok()) std::abort();
          if (i > 0) seconds[r] += Since(start);
          for (int64_t k = 0; k < numel; k += 997) ok[r] = ok[r] && data.data()[k] == want;
          ok[r] = ok[r] && data.data()[numel - 1] == want;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    const double time = *std::max_element(seconds.begin(), seconds.end()) / iters;
    const double algbw = bytes / time / 1e9;
    const double busbw = algbw * 2.0 * (members - 1) / members;
    const bool row_ok = std::all_of(ok.begin(), ok.end(), [](bool b) { return b; });
    all_ok = all_ok && row_ok;
    if (bytes >= (16 << 20)) goal = goal && busbw >= 0.8 * p2p;
    std::printf("%12lld %10.3f %10.3f %10.3f %8.2f %7s\n", static_cast<long long>(bytes),
                time * 1e3, algbw, busbw, busbw / p2p, row_ok ? "OK" : "WRONG");
    std::fflush(stdout);
  }
  std::printf("# check: %s; goal busbw >= 0.8 x point-to-point from 16 MiB up: %s\n",
              all_ok ? "every rank exact" : "WRONG RESULTS", goal ? "met" : "not met");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
