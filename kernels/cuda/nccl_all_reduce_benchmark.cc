// NCCL's all-reduce across this machine's GPUs, in the columns of
// worker/collectives/collective_benchmark (nccl-tests style: size, time,
// algbw, busbw, check), so the data-parallel issue's gRPC ring can be read
// next to NCCL where a GPU machine is lent. One rank per GPU, each a thread
// of this process with its own communicator (ncclCommInitRank), stream and
// buffers; sizes from 4 KiB, x4 each, to --max-mib.
//
// busbw = algbw * 2 (N - 1) / N, as nccl-tests and the ring's table: what
// each link carries. With one GPU an all-reduce is a local copy and busbw
// is 0; the table says so instead of pretending (NCCL refuses two ranks on
// one GPU).
//
// Check: rank r's input is all r + 1, so every element of every rank's
// result must be exactly N (N + 1) / 2 (small integers add exactly in
// fp32); the check column says OK only when each rank's whole result is.
//
// Built only under --config=cuda (the GPU bundle carries it):
//   nccl_all_reduce_benchmark [--ranks N] [--max-mib 256] [--iters 5]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flag_set.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/stream.h"

namespace pipetrain {
namespace {

struct Settings {
  int ranks = 0;  // 0: every visible GPU
  int max_mib = 256;
  int iters = 5;
};

// One rank's result per size: the mean seconds of an all-reduce (after one
// untimed) and whether its whole result was exact.
struct RankRow {
  double seconds = 0;
  bool exact = false;
};

std::vector<int64_t> Sizes(int max_mib) {
  std::vector<int64_t> bytes;
  for (int64_t b = 4096; b <= int64_t{max_mib} << 20; b *= 4) bytes.push_back(b);
  return bytes;
}

absl::StatusOr<std::vector<RankRow>> RunRank(const NcclUniqueId& id, int rank, const Settings& s) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  ASSIGN_OR_RETURN(NcclComm comm, NcclComm::Create(id, s.ranks, rank, rank));
  ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  const std::vector<int64_t> sizes = Sizes(s.max_mib);
  const int64_t most = sizes.back() / static_cast<int64_t>(sizeof(float));
  ASSIGN_OR_RETURN(DeviceBuffer<float> send, DeviceBuffer<float>::FromHost(std::vector<float>(
                                                 static_cast<size_t>(most), rank + 1.0f)));
  ASSIGN_OR_RETURN(DeviceBuffer<float> recv, DeviceBuffer<float>::Create(most));
  const float want = 0.5f * s.ranks * (s.ranks + 1);
  std::vector<RankRow> rows;
  for (const int64_t bytes : sizes) {
    const int64_t count = bytes / static_cast<int64_t>(sizeof(float));
    // One untimed, which also lines the ranks up (each waits for the others).
    RETURN_IF_ERROR(comm.AllReduceSum(send.data(), recv.data(), count, stream.get()));
    RETURN_IF_ERROR(stream.Synchronize());
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < s.iters; ++i) {
      RETURN_IF_ERROR(comm.AllReduceSum(send.data(), recv.data(), count, stream.get()));
    }
    RETURN_IF_ERROR(stream.Synchronize());
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::vector<float> got(static_cast<size_t>(count));
    RETURN_IF_ERROR(recv.CopyToHost(got.data(), count));
    const bool exact = std::all_of(got.begin(), got.end(), [want](float v) { return v == want; });
    rows.push_back({took.count() / s.iters, exact});
  }
  RETURN_IF_ERROR(comm.Destroy());
  return rows;
}

int Run(const std::vector<std::string>& args) {
  Settings s;
  FlagSet flags("usage: nccl_all_reduce_benchmark [--ranks N] [--max-mib 256] [--iters 5]");
  flags.Int("ranks", &s.ranks, "GPUs to use, one rank each (0: every visible GPU)");
  flags.Int("max-mib", &s.max_mib, "largest tensor, MiB (sizes from 4 KiB, x4 each)");
  flags.Int("iters", &s.iters, "timed all-reduces per size (after one untimed)");
  const absl::Status parsed = flags.Parse(args);
  if (!parsed.ok() || s.ranks < 0 || s.max_mib < 1 || s.iters < 1) {
    if (!parsed.ok()) std::fprintf(stderr, "%s\n", std::string(parsed.message()).c_str());
    std::fprintf(stderr, "%s", flags.Usage().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  const absl::StatusOr<int> gpus = CudaDeviceCount();
  if (!gpus.ok() || *gpus < 1) {
    std::fprintf(stderr, "no CUDA device: %s\n",
                 gpus.ok() ? "none visible" : std::string(gpus.status().message()).c_str());
    return 1;
  }
  if (s.ranks == 0) s.ranks = *gpus;
  if (s.ranks > *gpus) {
    std::fprintf(stderr, "--ranks %d: only %d GPU(s) visible, and NCCL takes one rank per GPU\n",
                 s.ranks, *gpus);
    return 2;
  }
  std::vector<std::string> names;
  for (int g = 0; g < s.ranks; ++g) {
    const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(g);
    names.push_back(info.ok() ? info->name : "?");
  }
  const absl::StatusOr<std::string> version = NcclVersion();
  const absl::StatusOr<NcclUniqueId> id = NcclUniqueId::Create();
  if (!id.ok()) {
    std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
    return 1;
  }
  std::printf("# all-reduce (sum, fp32) with NCCL %s: %d rank(s), one thread and GPU each: %s\n",
              version.ok() ? version->c_str() : "?", s.ranks, absl::StrJoin(names, ", ").c_str());
  if (s.ranks == 1) {
    std::printf(
        "# one GPU: the all-reduce is a local copy, so busbw is 0 by definition; "
        "NCCL needs two GPUs for a link\n");
  }
  std::fflush(stdout);

  std::vector<absl::StatusOr<std::vector<RankRow>>> results(s.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < s.ranks; ++r) {
    threads.emplace_back([&, r] { results[r] = RunRank(*id, r, s); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < s.ranks; ++r) {
    if (!results[r].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, results[r].status().ToString().c_str());
      return 1;
    }
  }
  std::printf("%12s %10s %10s %10s %7s\n", "size_B", "time_ms", "algbw_GBps", "busbw_GBps",
              "check");
  const std::vector<int64_t> sizes = Sizes(s.max_mib);
  bool all_exact = true;
  for (size_t i = 0; i < sizes.size(); ++i) {
    double seconds = 0;  // the slowest rank's
    bool exact = true;
    for (int r = 0; r < s.ranks; ++r) {
      seconds = std::max(seconds, (*results[r])[i].seconds);
      exact = exact && (*results[r])[i].exact;
    }
    all_exact = all_exact && exact;
    const double algbw = sizes[i] / seconds / 1e9;
    const double busbw = algbw * 2.0 * (s.ranks - 1) / s.ranks;
    std::printf("%12lld %10.3f %10.3f %10.3f %7s\n", static_cast<long long>(sizes[i]),
                seconds * 1e3, algbw, busbw, exact ? "OK" : "WRONG");
  }
  std::printf("# check: %s\n", all_exact ? "every rank exact" : "a result was wrong");
  return all_exact ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
