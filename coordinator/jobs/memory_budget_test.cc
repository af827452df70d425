#include "coordinator/jobs/memory_budget.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

v1::Worker CpuWorker(const std::string& host, int64_t ram, int64_t limit) {
  v1::Worker w;
  w.mutable_device()->set_hostname(host);
  w.mutable_device()->set_memory_bytes(ram);
  w.mutable_device()->set_memory_limit_bytes(limit);
  return w;
}

v1::Worker GpuWorker(const std::string& host, const std::string& bus, int index, int64_t memory) {
  v1::Worker w;
  w.mutable_device()->set_hostname(host);
  w.mutable_device()->set_memory_bytes(64 * kGiB);
  w.mutable_device()->set_gpu_model("GPU");
  w.mutable_device()->set_gpu_memory_bytes(memory);
  w.mutable_device()->set_gpu_pci_bus_id(bus);
  w.mutable_device()->set_gpu_index(index);
  return w;
}

// Four workers on one 24 GiB host with no limits of their own (what
// `pipetrain up` starts): a quarter each; a fifth on another host keeps its
// whole RAM.
TEST(PlanMemoryBudgetsTest, CpuWorkersOnOneHost_ShareItsRam) {
  std::vector<v1::Worker> w(4, CpuWorker("vm", 24 * kGiB, 24 * kGiB));
  w.push_back(CpuWorker("other", 16 * kGiB, 16 * kGiB));
  std::string shared;
  EXPECT_EQ(PlanMemoryBudgets(w, &shared),
            (std::vector<double>{6.0 * kGiB, 6.0 * kGiB, 6.0 * kGiB, 6.0 * kGiB, 16.0 * kGiB}));
  EXPECT_EQ(shared, "host vm's RAM shared by 4 workers");
}

// A cgroup or --memory-limit below the RAM is the process's own: not
// divided. A worker without one beside them shares the RAM with no one.
// Workers with limits of their own below the host's RAM keep them; the
// workers relying on the RAM share what those limits leave (the budgets
// of one host never add up to more than it has).
TEST(PlanMemoryBudgetsTest, OwnLimitsBelowTheRam_KeptAndTakenFromTheSharedRam) {
  std::vector<v1::Worker> w = {CpuWorker("node", 64 * kGiB, 8 * kGiB),
                               CpuWorker("node", 64 * kGiB, 8 * kGiB),
                               CpuWorker("node", 64 * kGiB, 0)};
  std::string shared;
  EXPECT_EQ(PlanMemoryBudgets(w, &shared),
            (std::vector<double>{8.0 * kGiB, 8.0 * kGiB, 48.0 * kGiB}));
  EXPECT_EQ(shared, "host node's RAM shared by 1 worker beside 2 workers with limits of their own");
  w.push_back(CpuWorker("node", 64 * kGiB, 0));
  w.push_back(CpuWorker("other", 64 * kGiB, 0));
  EXPECT_EQ(PlanMemoryBudgets(w),
            (std::vector<double>{8.0 * kGiB, 8.0 * kGiB, 24.0 * kGiB, 24.0 * kGiB, 64.0 * kGiB}));
  // Limits that take all of it leave the sharers a byte: nothing fits.
  const std::vector<v1::Worker> full = {CpuWorker("node", 16 * kGiB, 10 * kGiB),
                                        CpuWorker("node", 16 * kGiB, 10 * kGiB),
                                        CpuWorker("node", 16 * kGiB, 0)};
  EXPECT_EQ(PlanMemoryBudgets(full), (std::vector<double>{10.0 * kGiB, 10.0 * kGiB, 1.0}));
}

// A worker's --memory-reserve (DeviceInfo.memory_reserve_bytes) comes off
// what it gets, its own limit or its share of the RAM; a limit of its own
// still claims the whole from the sharers. Sharers with reserves stay
// sharers (their limit is the RAM): before, a worker took its reserve off
// the limit it reported, which then read as a limit of its own below the
// RAM, and two on a 64 GiB host were each planned with 63 GiB. Its share
// of the host's RAM for the corpus keeps the reserve (what it is for).
TEST(PlanMemoryBudgetsTest, Reserve_TakenOffTheBudgetSharersStillShare) {
  v1::Worker sharer = CpuWorker("node", 64 * kGiB, 64 * kGiB);
  sharer.mutable_device()->set_memory_reserve_bytes(kGiB);
  v1::Worker own = CpuWorker("node", 64 * kGiB, 16 * kGiB);
  own.mutable_device()->set_memory_reserve_bytes(4 * kGiB);
  EXPECT_EQ(PlanMemoryBudgets({sharer, sharer}), (std::vector<double>{31.0 * kGiB, 31.0 * kGiB}));
  EXPECT_EQ(PlanMemoryBudgets({sharer, own}), (std::vector<double>{47.0 * kGiB, 12.0 * kGiB}));
  EXPECT_EQ(HostRamBudgets({sharer, own}), (std::vector<double>{48.0 * kGiB, 16.0 * kGiB}));
  // A reserve of all of it leaves a byte, never unlimited; an unreported
  // memory stays unlimited.
  v1::Worker all = CpuWorker("node", 8 * kGiB, 4 * kGiB);
  all.mutable_device()->set_memory_reserve_bytes(4 * kGiB);
  EXPECT_EQ(PlanMemoryBudgets({all}), (std::vector<double>{1.0}));
  v1::Worker unreported = CpuWorker("", 0, 0);
  unreported.mutable_device()->set_memory_reserve_bytes(kGiB);
  EXPECT_EQ(PlanMemoryBudgets({unreported}), (std::vector<double>{0.0}));
}

// Without a hostname nothing says where a worker runs: each keeps its own.
TEST(PlanMemoryBudgetsTest, NoHostname_NothingShared) {
  const std::vector<v1::Worker> w(2, CpuWorker("", 24 * kGiB, 0));
  std::string shared = "stale";
  EXPECT_EQ(PlanMemoryBudgets(w, &shared), (std::vector<double>{24.0 * kGiB, 24.0 * kGiB}));
  EXPECT_EQ(shared, "");
}

// GPU workers share their GPU's memory with the plan's other workers on the
// same GPU (by bus id, else by index), not with other GPUs of the host.
TEST(PlanMemoryBudgetsTest, GpuWorkers_ShareOneGpuOnly) {
  const std::vector<v1::Worker> w = {GpuWorker("box", "0000:3B:00.0", 0, 80 * kGiB),
                                     GpuWorker("box", "0000:3B:00.0", 0, 80 * kGiB),
                                     GpuWorker("box", "0000:86:00.0", 1, 80 * kGiB),
                                     GpuWorker("box", "", 2, 40 * kGiB),
                                     GpuWorker("box", "", 2, 40 * kGiB)};
  std::string shared;
  EXPECT_EQ(PlanMemoryBudgets(w, &shared),
            (std::vector<double>{40.0 * kGiB, 40.0 * kGiB, 80.0 * kGiB, 20.0 * kGiB, 20.0 * kGiB}));
  EXPECT_EQ(shared,
            "GPU #2 of host box shared by 2 workers, GPU 0000:3B:00.0 of host box shared by 2 "
            "workers");
}

// A GPU worker's corpus lives in its host's RAM: the RAM shares count GPU
// workers as CPU ones (eight GPU workers of a 64 GiB host without limits
// of their own: 8 GiB each), one with a limit of its own keeps it.
TEST(HostRamBudgetsTest, GpuWorkersOfOneHost_ShareItsRam) {
  std::vector<v1::Worker> w;
  for (int g = 0; g < 8; ++g) w.push_back(GpuWorker("dgx", absl::StrCat("bus", g), g, 80 * kGiB));
  w.push_back(GpuWorker("other", "bus0", 0, 80 * kGiB));
  std::vector<double> expected(8, 8.0 * kGiB);
  expected.push_back(64.0 * kGiB);
  EXPECT_EQ(HostRamBudgets(w), expected);
  EXPECT_EQ(PlanMemoryBudgets(w)[0], 80.0 * kGiB);  // the plan's budget stays the GPU's
  w[0].mutable_device()->set_memory_limit_bytes(4 * kGiB);
  EXPECT_EQ(HostRamBudgets(w)[0], 4.0 * kGiB);
  EXPECT_EQ(HostRamBudgets(w)[1], 60.0 * kGiB / 7);
}

// --gpu-memory-reserve comes off each GPU worker's budget after the
// workers on one GPU share it (what it is for is each process's own): an
// 80 GiB GPU with a 2 GiB reserve plans 78 GiB; two workers on one 40 GiB
// GPU 18 GiB each; an unreported GPU memory stays unlimited. CPU workers
// keep theirs (their reserve is their own --memory-reserve).
TEST(PlanMemoryBudgetsTest, GpuReserve_TakenOffEachWorkersShare) {
  const int64_t reserve = 2 * kGiB;
  EXPECT_EQ(PlanMemoryBudgets({GpuWorker("box", "0000:01", 0, 80 * kGiB)}, nullptr, reserve),
            (std::vector<double>{78.0 * kGiB}));
  const std::vector<v1::Worker> w = {
      GpuWorker("box", "0000:02", 1, 40 * kGiB), GpuWorker("box", "0000:02", 1, 40 * kGiB),
      GpuWorker("", "", 0, 80 * kGiB), GpuWorker("box", "0000:03", 2, 0),
      CpuWorker("box", 64 * kGiB, 16 * kGiB)};
  EXPECT_EQ(PlanMemoryBudgets(w, nullptr, reserve),
            (std::vector<double>{18.0 * kGiB, 18.0 * kGiB, 78.0 * kGiB, 0.0, 16.0 * kGiB}));
  // All of it leaves a byte, never unlimited.
  EXPECT_EQ(PlanMemoryBudgets({GpuWorker("box", "0000:01", 0, kGiB)}, nullptr, 2 * kGiB),
            (std::vector<double>{1.0}));
}

// A checkpoint's snapshot downloads a GPU worker's stepped weights and
// both AdamW moments into its host's RAM (3 copies, CpuSteppedWeightCopies
// of a job with checkpoints and nothing else): a stage of 13 GiB of
// weights on an 80 GiB GPU needs 39 GiB of a 16 GiB host, and is refused
// naming the worker, its stage and both figures. Its plan counted the
// GPU's memory only, and the first checkpoint got it OOM-killed. With no
// host copies (0) it fits; so does a CPU worker, whose plan counts the
// copies in its memory already; an unreported host RAM is unlimited.
TEST(CheckGpuHostCopiesTest, SnapshotOverTheHostsRam_RefusedNamingTheWorker) {
  v1::Worker gpu = GpuWorker("node", "0000:01", 0, 80 * kGiB);
  gpu.set_id("gpu-1");
  gpu.mutable_device()->set_memory_bytes(16 * kGiB);
  gpu.mutable_device()->set_memory_limit_bytes(16 * kGiB);
  const std::vector<double> stepped = {13.0 * kGiB};
  const absl::Status refused = CheckGpuHostCopies({gpu}, {2}, stepped, {3}, true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(refused.message(),
            "GPU worker gpu-1 (stage 2) would need 41875931136 bytes (39.00 GiB) of host RAM for "
            "3 host copies of the 13958643712 bytes (13.00 GiB) of weights it steps (a "
            "checkpoint's snapshot or a resume's read of them and both AdamW moments, the "
            "data-parallel gradients' sum and residuals, the final weights, and any tensor ranks' "
            "gathers) but has 17179869184 bytes (16.00 GiB) of host "
            "node's RAM (its limit or share, less its --memory-reserve); give its host more RAM "
            "(its pod a higher memory limit), split the model over more stages, or turn "
            "checkpoints off (spec.checkpoint.intervalSteps 0)");
  EXPECT_TRUE(CheckGpuHostCopies({gpu}, {2}, stepped, {0}, true).ok());
  EXPECT_TRUE(
      CheckGpuHostCopies({CpuWorker("node", 16 * kGiB, 16 * kGiB)}, {0}, stepped, {3}, true).ok());
  v1::Worker unreported = GpuWorker("", "", 0, 80 * kGiB);
  unreported.mutable_device()->set_memory_bytes(0);
  EXPECT_TRUE(CheckGpuHostCopies({unreported}, {0}, stepped, {3}, true).ok());
}

// A job without checkpoints is refused for its other copies (here its
// final weights and the gradients' sum, 2 x 13 GiB of a 16 GiB host):
// turning checkpoints off, which it told such a job to do, would change
// nothing, so the advice leaves it out.
TEST(CheckGpuHostCopiesTest, NoCheckpoints_RefusalDoesNotAdviseTurningThemOff) {
  v1::Worker gpu = GpuWorker("node", "0000:01", 0, 80 * kGiB);
  gpu.set_id("gpu-1");
  gpu.mutable_device()->set_memory_bytes(16 * kGiB);
  gpu.mutable_device()->set_memory_limit_bytes(16 * kGiB);
  const absl::Status refused = CheckGpuHostCopies({gpu}, {0}, {13.0 * kGiB}, {2}, false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(refused.message(),
            "GPU worker gpu-1 (stage 0) would need 27917287424 bytes (26.00 GiB) of host RAM for "
            "2 host copies of the 13958643712 bytes (13.00 GiB) of weights it steps (a "
            "checkpoint's snapshot or a resume's read of them and both AdamW moments, the "
            "data-parallel gradients' sum and residuals, the final weights, and any tensor ranks' "
            "gathers) but has 17179869184 bytes (16.00 GiB) of host "
            "node's RAM (its limit or share, less its --memory-reserve); give its host more RAM "
            "(its pod a higher memory limit) or split the model over more stages");
}

// The GPU workers that share a host's RAM are checked together: their
// needs against the sum of their shares (as a CPU worker's plan would get
// them), each less its --memory-reserve. Two GPU workers of a 64 GiB host
// with 4 GiB reserves have 56 GiB: 27 and 29 GiB of copies fit (equal
// shares of 28 GiB refused the second), 27 and 31 do not, naming the
// worker that needs the most.
TEST(CheckGpuHostCopiesTest, SharersOfAHost_CheckedTogetherLessTheirReserves) {
  std::vector<v1::Worker> w = {GpuWorker("node", "0000:01", 0, 80 * kGiB),
                               GpuWorker("node", "0000:02", 1, 80 * kGiB)};
  for (int i = 0; i < 2; ++i) {
    w[i].set_id(absl::StrCat("gpu-", i));
    w[i].mutable_device()->set_memory_reserve_bytes(4 * kGiB);
  }
  EXPECT_TRUE(CheckGpuHostCopies(w, {0, 1}, {9.0 * kGiB, 29.0 * kGiB / 3}, {3, 3}, true).ok());
  const absl::Status refused =
      CheckGpuHostCopies(w, {0, 1}, {9.0 * kGiB, 31.0 * kGiB / 3}, {3, 3}, true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("GPU worker gpu-1 (stage 1) would need 33285996544 bytes "
                                   "(31.00 GiB)"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("and the plan's 2 GPU workers sharing host node's RAM would "
                                   "need 62277025792 bytes (58.00 GiB) in all, but have "
                                   "60129542144 bytes (56.00 GiB) of it"),
            std::string::npos)
      << refused;
}

// A job of T = 8 on the 8 GPUs of one host, 28 GiB of weights in its one
// stage (3.5 GiB a rank), with spec.output.weights_path: only replica 0's
// rank 0 gathers the final weights unsplit, 8 shards beside its own
// download, 9 x 3.5 GiB; every other rank downloads its shard to check it
// and once more to send it, 2 x 3.5 GiB. 80.5 GiB in all fit a 128 GiB
// host (charged 9 each, 252 GiB, they did not); a 64 GiB host is refused
// naming the rank that needs the most. With checkpoints, a resume has
// every rank read the stage's weights and both moments unsplit at once (3
// x 28 GiB) beside its own part cut from them: 8 x 87.5 GiB, refused on a
// 512 GiB host, which charged only the writer's 84 GiB snapshot and then
// got the ranks OOM-killed at every recovery. So are D = 8 replicas of
// the stage, 4 x 28 GiB each.
TEST(CheckGpuHostCopiesTest, EightGpusOfOneHost_OnlyTheWriterGathersEveryRankResumes) {
  std::vector<v1::Worker> w;
  for (int g = 0; g < 8; ++g) {
    w.push_back(GpuWorker("dgx", absl::StrCat("bus", g), g, 80 * kGiB));
    w.back().set_id(absl::StrCat("gpu-", g));
    w.back().mutable_device()->set_memory_bytes(128 * kGiB);
  }
  ResolvedJobSpec tensor;
  tensor.tensor_parallel = 8;
  tensor.spec.mutable_output()->set_weights_path("out.safetensors");
  std::vector<double> copies;
  for (int t = 0; t < 8; ++t) copies.push_back(GpuHostCopiesAt(tensor, 0, t));
  EXPECT_EQ(copies, (std::vector<double>{9, 2, 2, 2, 2, 2, 2, 2}));
  const std::vector<int> stages(8, 0);
  const std::vector<double> shard(8, 3.5 * kGiB);
  EXPECT_TRUE(CheckGpuHostCopies(w, stages, shard, copies, false).ok());
  for (v1::Worker& small : w) small.mutable_device()->set_memory_bytes(64 * kGiB);
  absl::Status refused = CheckGpuHostCopies(w, stages, shard, copies, false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("GPU worker gpu-0 (stage 0) would need 33822867456 bytes "
                                   "(31.50 GiB) of host RAM for 9 host copies of the "
                                   "3758096384 bytes (3.50 GiB) of weights it steps"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("8 GPU workers sharing host dgx's RAM would need 86436216832 "
                                   "bytes (80.50 GiB) in all, but have 68719476736 bytes "
                                   "(64.00 GiB) of it"),
            std::string::npos)
      << refused;

  for (v1::Worker& large : w) large.mutable_device()->set_memory_bytes(512 * kGiB);
  tensor.spec.clear_output();
  tensor.spec.mutable_checkpoint()->set_interval_steps(100);
  copies.clear();
  for (int t = 0; t < 8; ++t) copies.push_back(GpuHostCopiesAt(tensor, 0, t));
  EXPECT_EQ(copies, std::vector<double>(8, 8 * 3 + 1));
  refused = CheckGpuHostCopies(w, stages, shard, copies, true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("GPU worker gpu-0 (stage 0) would need 93952409600 bytes "
                                   "(87.50 GiB) of host RAM for 25 host copies"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("8 GPU workers sharing host dgx's RAM would need 751619276800 "
                                   "bytes (700.00 GiB) in all, but have 549755813888 bytes "
                                   "(512.00 GiB) of it"),
            std::string::npos)
      << refused;
  ResolvedJobSpec data;
  data.data_parallel = 8;
  data.spec.mutable_checkpoint()->set_interval_steps(100);
  std::vector<double> replica_copies;
  for (int r = 0; r < 8; ++r) replica_copies.push_back(GpuHostCopiesAt(data, r, 0));
  EXPECT_EQ(replica_copies, std::vector<double>(8, 3 + 1));
  EXPECT_EQ(
      CheckGpuHostCopies(w, stages, std::vector<double>(8, 28.0 * kGiB), replica_copies, true)
          .code(),
      absl::StatusCode::kResourceExhausted);
}

// Each position's most over the phases of its run, D = 2 replicas of T = 2
// ranks. Exact sums: the final weights' download, or the gradients' sum
// during a step, 1 each. A quantizer's: the residual, the sum and what the
// codec dropped, 3 at every replica. With checkpoints the resume, every
// position's 2 x (3 + its replica's residual) + 2, except the writer's
// steps: its snapshot (2 x (3 + both replicas' residuals), and the 2
// residuals of its own shards they were gathered from) beside the
// residual, the sum and what was dropped. With spec.output.weights_path
// the writer's last step: its snapshot still written beside the residual,
// its download and the 2 shards gathered for the upload. With
// spec.init.from its stage's T shards read unsplit and its part of them.
TEST(GpuHostCopiesAtTest, MostOfItsPhases) {
  ResolvedJobSpec r;
  r.data_parallel = 2;
  r.tensor_parallel = 2;
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1);
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 1), 1);
  r.data_parallel_quantizer = "bf16";
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 3);
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 3);
  r.spec.mutable_checkpoint()->set_interval_steps(10);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1 + 2 + 2 * (3 + 2) + 2);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 1), 2 * (3 + 1) + 1 + 1);
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 2 * (3 + 1) + 1 + 1);
  r.spec.mutable_output()->set_weights_path("out.safetensors");
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1 + 2 * (3 + 2) + 2 + 1 + 2);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 1), 2 * (3 + 1) + 1 + 1);
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 1), 2 * (3 + 1) + 1 + 1);
  ResolvedJobSpec from;
  from.tensor_parallel = 4;
  from.spec.mutable_init()->set_from("checkpoints/old");
  EXPECT_EQ(GpuHostCopiesAt(from, 0, 0), 4 + 1);
  EXPECT_EQ(GpuHostCopiesAt(from, 0, 3), 4 + 1);
}

// With T > 1 and compressed replicas the writer's snapshot gathers its
// ranks' residuals unsplit into new tensors (T per replica's) beside the
// buffer its own shards' arrived in (GatherReplicaFeedback, 1 per
// replica's), which a tensor held whole (a LayerNorm's residual, a view of
// it) keeps as long as the snapshot. T = 2, D = 8, a quantizer: the
// snapshot is 2 x (3 + 8) + 8 = 30, 31 while it is taken and 33 during the
// next steps (the residual, the sum and what the codec dropped), where 25
// was charged and every checkpoint held 6 shards more. Past 8 replicas
// their sum, 1. At T = 1 the snapshot's residuals are the buffer's views:
// 3 + 8 beside the step's 3.
TEST(GpuHostCopiesAtTest, TensorRanksWithCompressedReplicas_WriterHoldsTheResidualsBuffer) {
  ResolvedJobSpec r;
  r.data_parallel = 8;
  r.tensor_parallel = 2;
  r.data_parallel_quantizer = "fp16";
  r.spec.mutable_checkpoint()->set_interval_steps(10);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1 + 2 + 2 * (3 + 8) + 8);
  // The others: a resume's 2 x (3 + 1) + 2 (replica 0's rank 1 gets every
  // replica's residual of its shards beside its own two, as many).
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 1), 2 * (3 + 1) + 1 + 1);
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 2 * (3 + 1) + 1 + 1);
  r.data_parallel = 9;
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1 + 2 + 2 * (3 + 1) + 1);
  r.data_parallel = 8;
  r.tensor_parallel = 1;
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1 + 2 + (3 + 8));
}

// On a resume every replica and rank reads its stage's weights and both
// moments (job_runner.cc ReadResume) and holds them until Restore, which
// cuts its part of every weight beside them: 3 + 1 at replica 1 of D = 2,
// where 0 was charged (only the writer was) and every recovery got the
// replicas OOM-killed at once. The unit files hold the unsplit tensors,
// so each of T = 2 ranks reads 3 x 2 shards. A replica that folds a
// residual reads it unsplit and keeps its part: 9 replicas keep their sum
// only (replica 0's to fold), 2 each their own.
TEST(GpuHostCopiesAtTest, CheckpointsOn_EveryPositionHoldsItsResume) {
  ResolvedJobSpec r;
  r.data_parallel = 2;
  r.spec.mutable_checkpoint()->set_interval_steps(10);
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 3 + 1);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 3 + 1);
  ResolvedJobSpec tensor;
  tensor.tensor_parallel = 2;
  tensor.spec.mutable_checkpoint()->set_interval_steps(10);
  EXPECT_EQ(GpuHostCopiesAt(tensor, 0, 1), 2 * 3 + 1);
  r.data_parallel_quantizer = "bf16";
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), (3 + 1) + 1 + 1);
  r.data_parallel = 9;
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 3 + 1);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1 + 2 + (3 + 1));  // its steps beside its snapshot
}

// Replicas without a replica device group (on other hosts) sum the whole
// stage's gradients in one host tensor each step (AllReduceFlat): 1 at
// replica 1 of D = 2 without checkpoints, where 0 was charged. With a
// quantizer what it dropped too, beside the residual: 3; with PowerSGD
// the residual beside the sum: 2.
TEST(GpuHostCopiesAtTest, Replicas_HoldTheGradientsSumOnTheHost) {
  ResolvedJobSpec r;
  r.data_parallel = 2;
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 1);
  r.data_parallel_quantizer = "fp16";
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 1 + 1 + 1);
  r.data_parallel_quantizer.clear();
  r.data_parallel_powersgd_rank = 4;
  EXPECT_EQ(GpuHostCopiesAt(r, 1, 0), 1 + 1);
}

// After the last step every GPU worker downloads the weights it steps (1),
// and replica 0 with spec.output.weights_path downloads them again for the
// upload: 2 at T = 1, where 0 was charged (on the CPU the copies share
// storage). At T = 2 rank 0 gathers both shards for it, rank 1 sends its
// own. With checkpoints the last snapshot, still written, is held beside
// them: 3 + 2.
TEST(GpuHostCopiesAtTest, LastStep_FinalWeightsDownloadedAndAgainForTheUpload) {
  ResolvedJobSpec r;
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 1);
  r.spec.mutable_output()->set_weights_path("out.safetensors");
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 2);
  r.spec.mutable_checkpoint()->set_interval_steps(10);
  EXPECT_EQ(GpuHostCopiesAt(r, 0, 0), 3 + 2);
  ResolvedJobSpec tensor;
  tensor.tensor_parallel = 2;
  tensor.spec.mutable_output()->set_weights_path("out.safetensors");
  EXPECT_EQ(GpuHostCopiesAt(tensor, 0, 0), 1 + 2);
  EXPECT_EQ(GpuHostCopiesAt(tensor, 0, 1), 1 + 1);
}

// Unreported memory (0) stays "unlimited".
TEST(PlanMemoryBudgetsTest, Unreported_StaysUnlimited) {
  const std::vector<v1::Worker> w(3, CpuWorker("vm", 0, 0));
  EXPECT_EQ(PlanMemoryBudgets(w), (std::vector<double>{0, 0, 0}));
}

// Two workers sharing a 24 GiB host, one with 16 GiB of its own host and
// one with an 8 GiB limit of its own: two get 24 GiB and 16 GiB (12 GiB
// each on the shared host would be less), three add a share of the host
// (12 GiB beats the limited 8 GiB).
TEST(RoomiestWorkersTest, SpreadsOverHostsBeforeSharingOne) {
  const std::vector<v1::Worker> w = {
      CpuWorker("vm", 24 * kGiB, 24 * kGiB), CpuWorker("vm", 24 * kGiB, 24 * kGiB),
      CpuWorker("small", 32 * kGiB, 8 * kGiB), CpuWorker("other", 16 * kGiB, 16 * kGiB)};
  EXPECT_EQ(RoomiestWorkers(w, 2), (std::vector<size_t>{0, 3}));
  EXPECT_EQ(RoomiestWorkers(w, 3), (std::vector<size_t>{0, 3, 1}));
  EXPECT_EQ(RoomiestWorkers(w, 9), (std::vector<size_t>{0, 3, 1, 2}));
  EXPECT_TRUE(RoomiestWorkers(w, 0).empty());
}

// A reserve comes off a worker's budget in the ranking too, as
// PlanMemoryBudgets takes it: a 16 GiB limit with a 12 GiB reserve (4 GiB
// for plans) ranks below two 12 GiB workers, and a sharer's reserve comes
// off its share.
TEST(RoomiestWorkersTest, ReserveComesOffTheBudgetRanked) {
  v1::Worker reserved = CpuWorker("a", 64 * kGiB, 16 * kGiB);
  reserved.mutable_device()->set_memory_reserve_bytes(12 * kGiB);
  const std::vector<v1::Worker> w = {reserved, CpuWorker("b", 64 * kGiB, 12 * kGiB),
                                     CpuWorker("c", 64 * kGiB, 12 * kGiB)};
  EXPECT_EQ(RoomiestWorkers(w, 2), (std::vector<size_t>{1, 2}));
  v1::Worker sharer = CpuWorker("d", 24 * kGiB, 24 * kGiB);
  sharer.mutable_device()->set_memory_reserve_bytes(20 * kGiB);
  EXPECT_EQ(RoomiestWorkers({sharer, CpuWorker("e", 8 * kGiB, 8 * kGiB)}, 1),
            (std::vector<size_t>{1}));
}

// A recovering job's survivors are in the plan already: a spare on their
// host divides its RAM with them. Alone, vm's spare (30 GiB) looks roomier
// than other's 12 GiB; beside the two survivors on vm it would leave each
// of the three 10 GiB, while other's keeps them at 15 and has 12 itself.
TEST(RoomiestWorkersTest, BesideSurvivorsOnAHost_ASpareThereCountsItsShare) {
  const std::vector<v1::Worker> survivors = {CpuWorker("vm", 30 * kGiB, 30 * kGiB),
                                             CpuWorker("vm", 30 * kGiB, 30 * kGiB)};
  const std::vector<v1::Worker> spares = {CpuWorker("vm", 30 * kGiB, 30 * kGiB),
                                          CpuWorker("other", 12 * kGiB, 12 * kGiB)};
  EXPECT_EQ(RoomiestWorkers(spares, 1), (std::vector<size_t>{0}));
  EXPECT_EQ(RoomiestWorkers(spares, 1, survivors), (std::vector<size_t>{1}));
  EXPECT_EQ(RoomiestWorkers(spares, 2, survivors), (std::vector<size_t>{1, 0}));
}

// A worker with a limit of its own leaves the RAM its host's sharers split
// smaller: after node's first sharer (64 GiB), its second (32 GiB each)
// comes before the 40 GiB limit, which would leave the first 24; then the
// other host's 20 GiB, not the limit, which would leave them (64 - 40) / 2.
TEST(RoomiestWorkersTest, ChosenOwnLimitsLeaveTheSharersLess) {
  const std::vector<v1::Worker> w = {
      CpuWorker("node", 64 * kGiB, 40 * kGiB), CpuWorker("node", 64 * kGiB, 64 * kGiB),
      CpuWorker("node", 64 * kGiB, 64 * kGiB), CpuWorker("other", 20 * kGiB, 20 * kGiB)};
  EXPECT_EQ(RoomiestWorkers(w, 2), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(RoomiestWorkers(w, 3), (std::vector<size_t>{1, 2, 3}));
}

// A limit chosen after a sharer of its host takes from that sharer: with
// node's 64 GiB sharer chosen, its 60 GiB limit would leave the sharer 4;
// the other host's 32 GiB is the roomier second (the job was refused on
// the first two and failed, as the 'roomiest' set was the same one).
TEST(RoomiestWorkersTest, ALimitThatWouldStarveAChosenSharer_NotChosen) {
  const std::vector<v1::Worker> w = {CpuWorker("node", 64 * kGiB, 64 * kGiB),
                                     CpuWorker("node", 64 * kGiB, 60 * kGiB),
                                     CpuWorker("other", 32 * kGiB, 32 * kGiB)};
  const std::vector<size_t> chosen = RoomiestWorkers(w, 2);
  EXPECT_EQ(chosen, (std::vector<size_t>{0, 2}));
  std::vector<v1::Worker> picked;
  for (size_t i : chosen) picked.push_back(w[i]);
  const std::vector<double> budgets = PlanMemoryBudgets(picked);
  EXPECT_EQ(*std::min_element(budgets.begin(), budgets.end()), 32.0 * kGiB);
}

// Each pick is the best partner for those before it: on a mixed cluster
// (sharers, limits, a worker without a host), no other second worker gives
// the pair a larger smallest budget, as PlanMemoryBudgets divides them.
TEST(RoomiestWorkersTest, Pairs_TheFirstsBestPartner) {
  const std::vector<v1::Worker> w = {
      CpuWorker("a", 64 * kGiB, 64 * kGiB), CpuWorker("a", 64 * kGiB, 48 * kGiB),
      CpuWorker("a", 64 * kGiB, 64 * kGiB), CpuWorker("b", 16 * kGiB, 16 * kGiB),
      CpuWorker("c", 40 * kGiB, 30 * kGiB), CpuWorker("", 20 * kGiB, 20 * kGiB)};
  const std::vector<size_t> chosen = RoomiestWorkers(w, 2);
  ASSERT_EQ(chosen.size(), 2u);
  auto smallest = [&](size_t i, size_t j) {
    const std::vector<double> b = PlanMemoryBudgets({w[i], w[j]});
    return std::min(b[0], b[1]);
  };
  double best = 0;
  for (size_t j = 0; j < w.size(); ++j) {
    if (j != chosen[0]) best = std::max(best, smallest(chosen[0], j));
  }
  EXPECT_EQ(smallest(chosen[0], chosen[1]), best);
}

// An unreported budget is unlimited, so it goes first; equal ones keep
// their order.
TEST(RoomiestWorkersTest, UnlimitedFirst_TiesInOrder) {
  const std::vector<v1::Worker> w = {CpuWorker("a", 8 * kGiB, 8 * kGiB),
                                     CpuWorker("b", 8 * kGiB, 8 * kGiB), CpuWorker("c", 0, 0)};
  EXPECT_EQ(RoomiestWorkers(w, 2), (std::vector<size_t>{2, 0}));
}

// --gpu-memory-reserve comes off a GPU worker's budget in the ranking too,
// as PlanMemoryBudgets takes it: an 80 GiB GPU with a 2 GiB reserve (78
// GiB for plans) ranks below a CPU worker's 79 GiB.
TEST(RoomiestWorkersTest, GpuReserveComesOffTheBudgetRanked) {
  const std::vector<v1::Worker> w = {GpuWorker("h", "0000:01", 0, 80 * kGiB),
                                     CpuWorker("c", 79 * kGiB, 79 * kGiB)};
  EXPECT_EQ(RoomiestWorkers(w, 1), (std::vector<size_t>{0}));
  EXPECT_EQ(RoomiestWorkers(w, 1, {}, 2 * kGiB), (std::vector<size_t>{1}));
}

// Two GPUs of one host, two workers on the first: the second GPU's worker
// comes before the first GPU's second worker.
TEST(RoomiestWorkersTest, GpuWorkers_SharedGpuLast) {
  const std::vector<v1::Worker> w = {GpuWorker("h", "0000:01", 0, 80 * kGiB),
                                     GpuWorker("h", "0000:01", 0, 80 * kGiB),
                                     GpuWorker("h", "0000:02", 1, 80 * kGiB)};
  EXPECT_EQ(RoomiestWorkers(w, 2), (std::vector<size_t>{0, 2}));
}

}  // namespace
}  // namespace pipetrain
