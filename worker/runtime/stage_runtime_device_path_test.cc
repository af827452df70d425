// LINK_PATH_DEVICE in the runtime (the CUDA issue, scope 5), on the CPU:
// programs marked by the coordinator's PlanDeviceLinks, the stages of each
// device group given channels of an InProcessDeviceHub (FIFO per pair, as
// NCCL matches in issue order). DESIGN.md §4 must still hold bitwise: the
// path a tensor takes changes nothing but where it travels. The NCCL channel
// itself needs two GPUs and runs in no test here (nccl_device_channel.h).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/annotated_mutex.h"
#include "coordinator/planner/device_links.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/in_process_device_channel.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

using testing::kIterations;
using testing::MakeDataset;
using testing::RunLocal;
using testing::RunOutput;
using testing::RunPipeline;
using testing::SmallConfig;

// Stage s on `hosts[s]`, GPU s, each with an id of its own.
std::vector<DeviceLinkMember> Members(const std::vector<std::string>& hosts) {
  std::vector<DeviceLinkMember> members;
  for (size_t s = 0; s < hosts.size(); ++s) {
    members.push_back({hosts[s], static_cast<int>(s), "id-" + std::to_string(s)});
  }
  return members;
}

// The LINK_PATH_DEVICE sends of the programs the pipeline runs, per iteration.
int DeviceSendsPerIteration(const TrainConfig& c, const std::vector<Range>& forward,
                            const std::vector<Range>& backward, Schedule schedule,
                            const std::vector<DeviceLinkMember>& members) {
  auto programs =
      CompileBiPartitionPrograms(forward, backward, NumUnits(c.model), c.micro_batches, schedule)
          .value();
  PlanDeviceLinks(members, &programs);
  int sends = 0;
  for (const v1::Program& p : programs) {
    for (const v1::Instruction& in : p.instructions()) {
      sends += in.has_send() && in.send().path() == v1::LINK_PATH_DEVICE;
    }
  }
  return sends;
}

void ExpectSameTraining(const RunOutput& pipe, const RunOutput& local) {
  EXPECT_EQ(pipe.losses, local.losses);
  EXPECT_EQ(pipe.val_losses, local.val_losses);
  ASSERT_EQ(pipe.weights.size(), local.weights.size());
  for (const auto& [name, values] : local.weights) {
    EXPECT_EQ(pipe.weights.at(name), values) << name;
  }
}

struct Case {
  std::string name;
  std::vector<Range> forward, backward;
  std::string schedule;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  return {
      {"P2_1f1b", {{0, 3}, {3, 6}}, {{0, 3}, {3, 6}}, "1f1b"},
      {"P4_1f1b", {{0, 2}, {2, 3}, {3, 5}, {5, 6}}, {{0, 2}, {2, 3}, {3, 5}, {5, 6}}, "1f1b"},
      {"P4_gpipe", {{0, 2}, {2, 3}, {3, 5}, {5, 6}}, {{0, 2}, {2, 3}, {3, 5}, {5, 6}}, "gpipe"},
      // Bi-Partition: recompute, input routing and weight sync (UNIT_WEIGHTS
      // stay on the wire) beside device links.
      {"P3_BackwardCutFirst", {{0, 1}, {1, 4}, {4, 6}}, {{0, 2}, {2, 4}, {4, 6}}, "1f1b"},
      {"P4_Staggered", {{0, 2}, {2, 3}, {3, 4}, {4, 6}}, {{0, 1}, {1, 3}, {3, 5}, {5, 6}}, "1f1b"},
  };
}

class DevicePathTest : public ::testing::TestWithParam<Case> {};

TEST_P(DevicePathTest, OneHost_EqualsSingleProcessBitwise) {
  const Case& k = GetParam();
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  const Schedule schedule = ParseSchedule(k.schedule).value();
  const auto members = Members(std::vector<std::string>(k.forward.size(), "host-a"));
  const RunOutput local = RunLocal(c, data);
  const RunOutput pipe = RunPipeline(c, data, k.forward, k.backward, schedule, nullptr, &members);
  ExpectSameTraining(pipe, local);
  const int per_iteration = DeviceSendsPerIteration(c, k.forward, k.backward, schedule, members);
  EXPECT_GT(per_iteration, 0);
  EXPECT_EQ(pipe.device_tensors, int64_t{per_iteration} * kIterations);
  EXPECT_GE(pipe.grouped_stages.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Plans, DevicePathTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Two hosts: two groups, and the link between them on the wire.
TEST(DevicePathMixedTest, TwoHosts_TwoGroupsAndTheWireBetween_EqualsSingleProcess) {
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = {{0, 2}, {2, 3}, {3, 5}, {5, 6}};
  const auto members = Members({"host-a", "host-a", "host-b", "host-b"});
  const RunOutput local = RunLocal(c, data);
  const RunOutput pipe =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, &members);
  ExpectSameTraining(pipe, local);
  EXPECT_EQ(pipe.grouped_stages, (std::vector<int>{0, 1, 2, 3}));
  // Per micro-batch an activation and a gradient inside each group.
  EXPECT_EQ(pipe.device_tensors, int64_t{2} * 2 * c.micro_batches * kIterations);
}

// Units [0, 3) and [3, 6), and their 1F1B programs with the links marked
// for one host.
std::vector<Range> TwoStages() { return {{0, 3}, {3, 6}}; }

std::vector<v1::Program> TwoStageDevicePrograms() {
  auto programs =
      CompilePrograms(TwoStages(), 6, SmallConfig().micro_batches, Schedule::kOneFOneB).value();
  PlanDeviceLinks(Members({"h", "h"}), &programs);
  return programs;
}

// What went device to device is counted per link, sent and received.
TEST(DevicePathStatsTest, DeviceTransfers_CountedAsDeviceBytes) {
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = TwoStages();
  const std::vector<v1::Program> programs = TwoStageDevicePrograms();
  InProcessFabric fabric(2);
  InProcessDeviceHub hub(2, absl::Seconds(30));
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<DeviceChannel>> channels;
  std::vector<std::unique_ptr<StageRuntime>> runtimes;
  for (int s = 0; s < 2; ++s) {
    transports.push_back(fabric.Connect(s));
    channels.push_back(hub.ChannelFor(s));
    StageSetup setup{
        "job-dev",        c, s, 2, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]), programs[s],
        absl::Seconds(30)};
    setup.device_channel = channels[s].get();
    runtimes.push_back(StageRuntime::Create(setup, &data, transports[s].get()).value());
  }
  std::vector<absl::StatusOr<IterationResult>> results(2, absl::UnknownError("not run"));
  std::thread stage1([&] { results[1] = runtimes[1]->RunIteration(0); });
  results[0] = runtimes[0]->RunIteration(0);
  stage1.join();
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  // One activation [2, 16, 32] per micro-batch down, one gradient up.
  const int64_t bytes = int64_t{4} * c.micro_batches * 2 * 16 * 32;
  const LinkStats& down = results[0]->sent.at({1, "ACTIVATION"});
  EXPECT_EQ(down.device_bytes, bytes);
  EXPECT_EQ(down.wire_bytes, bytes);
  EXPECT_EQ(down.tensors, c.micro_batches);
  EXPECT_EQ(results[1]->sent.at({0, "ACTIVATION_GRAD"}).device_bytes, bytes);
  EXPECT_EQ(results[1]->received.at({0, "ACTIVATION"}).device_bytes, bytes);
  EXPECT_EQ(results[0]->received.at({1, "ACTIVATION_GRAD"}).device_bytes, bytes);
  // The tied embedding gradient stays on the wire.
  EXPECT_EQ(results[1]->sent.at({0, "TIED_EMBEDDING_GRAD"}).device_bytes, 0);
}

// --- StageRuntime::Create's checks of device-path instructions.

StageSetup TwoStageSetup(v1::Program program) {
  const TrainConfig c = SmallConfig();
  StageSetup setup{"job-dev",       c, 0, 2, ToUnitRange({0, 3}), ToUnitRange({0, 3}), program,
                   absl::Seconds(5)};
  return setup;
}

v1::Program OneSend(v1::TensorKind kind, const std::string& codec) {
  v1::Program program;
  v1::Instruction::Send* send = program.add_instructions()->mutable_send();
  send->mutable_tensor()->set_kind(kind);
  send->mutable_tensor()->set_unit(2);
  send->set_peer_stage(1);
  send->set_codec(codec);
  send->set_path(v1::LINK_PATH_DEVICE);
  return program;
}

// A program of one device-path receive of unit 2's activation gradient.
v1::Program OneRecv(const std::string& codec) {
  v1::Program program;
  v1::Instruction::Recv* recv = program.add_instructions()->mutable_recv();
  recv->mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION_GRAD);
  recv->mutable_tensor()->set_unit(2);
  recv->set_peer_stage(1);
  recv->set_codec(codec);
  recv->set_path(v1::LINK_PATH_DEVICE);
  return program;
}

// A channel that refuses every send (a device or NCCL error).
class RefusingChannel : public DeviceChannel {
 public:
  absl::Status Send(int, const Tensor&) override {
    return absl::InternalError("ncclSend failed: unhandled cuda error");
  }
  absl::StatusOr<Tensor> Recv(int, const Shape&) override {
    return absl::InternalError("ncclRecv failed");
  }
  absl::Status Flush(absl::Duration, const std::function<bool()>&) override {
    return absl::OkStatus();
  }
  void Abort() override {}
};

TEST(DevicePathCreateTest, DevicePathWithoutChannel_InvalidArgument) {
  const Dataset data = MakeDataset();
  InProcessFabric fabric(2);
  auto transport = fabric.Connect(0);
  auto runtime = StageRuntime::Create(TwoStageSetup(OneSend(v1::TENSOR_KIND_ACTIVATION, "")), &data,
                                      transport.get());
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(runtime.status().message(),
                                "cannot take the device path: the worker joined no device group"))
      << runtime.status();
}

// A device-path receive naming its raw send's codec, "none" (the planner
// marks every receive with its send's), is taken.
TEST(DevicePathCreateTest, ReceiveOfARawSend_Taken) {
  const Dataset data = MakeDataset();
  InProcessFabric fabric(2);
  auto transport = fabric.Connect(0);
  RefusingChannel channel;
  StageSetup setup = TwoStageSetup(OneRecv("none"));
  setup.device_channel = &channel;
  auto runtime = StageRuntime::Create(setup, &data, transport.get());
  EXPECT_TRUE(runtime.ok()) << runtime.status();
}

TEST(DevicePathCreateTest, CompressedOrWeightsOnTheDevicePath_InvalidArgument) {
  const Dataset data = MakeDataset();
  InProcessFabric fabric(2);
  auto transport = fabric.Connect(0);
  RefusingChannel channel;
  for (const auto& [program, why] :
       {std::pair<v1::Program, std::string>{OneSend(v1::TENSOR_KIND_ACTIVATION, "fp16"),
                                            "it is compressed"},
        // A receive's codec too: the device path carries raw tensors only
        // ("none", a raw send's, is one: see below).
        {OneRecv("fp16"), "it is compressed"},
        {OneSend(v1::TENSOR_KIND_UNIT_WEIGHTS, ""), "UNIT_WEIGHTS are packed on the host"},
        {OneSend(v1::TENSOR_KIND_TIED_EMBEDDING_GRAD, ""),
         "only activations and their gradients take it"}}) {
    StageSetup setup = TwoStageSetup(program);
    setup.device_channel = &channel;
    auto runtime = StageRuntime::Create(setup, &data, transport.get());
    ASSERT_FALSE(runtime.ok()) << why;
    EXPECT_EQ(runtime.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(runtime.status().message(), why)) << runtime.status();
  }
}

// Set once the device receive began: the sends below fail only then, so
// the iteration meets the failure at the receive, as when the peer's answer
// is what the failed send held up (not at a later Send instruction).
struct ReceiveBegan {
  void Set() {
    AnnotatedMutexLock lock(&mu);
    began = true;
  }
  void Await() {
    AnnotatedMutexLock lock(&mu);
    mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return began; },
                        absl::Seconds(30));
  }
  AnnotatedMutex mu;
  bool began ABSL_GUARDED_BY(mu) = false;
};

// A transport whose every send is refused as a codec refuses a non-finite
// tensor ("training diverged"), once the device receive began, and which
// receives nothing.
class DivergedSendsTransport : public Transport {
 public:
  explicit DivergedSendsTransport(ReceiveBegan* began) : began_(began) {}
  int stage() const override { return 0; }
  absl::Status SendWire(int, const TensorAddress&, const WireTensor&) override {
    began_->Await();
    return absl::FailedPreconditionError("training diverged: element 3 is nan");
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress&, absl::Duration) override {
    return absl::DeadlineExceededError("nothing on the wire here");
  }

 private:
  ReceiveBegan* const began_;
};

// A channel whose receives time out at once: the peer never sent (it was
// waiting for this stage's send).
class TimedOutChannel : public DeviceChannel {
 public:
  explicit TimedOutChannel(ReceiveBegan* began) : began_(began) {}
  absl::Status Send(int, const Tensor&) override { return absl::OkStatus(); }
  absl::StatusOr<Tensor> Recv(int peer, const Shape&) override {
    began_->Set();
    return absl::DeadlineExceededError(
        absl::StrCat("device channel: nothing from stage ", peer, " in time"));
  }
  absl::Status Flush(absl::Duration, const std::function<bool()>&) override {
    return absl::OkStatus();
  }
  void Abort() override {}

 private:
  ReceiveBegan* const began_;
};

// Activations down the wire (a compressed link stays there), gradients up
// the device path: the wire send fails in the background, the device
// receive of the answer to it times out, and the iteration fails with the
// send's code (a diverged model), not as a lost peer's timeout, after which
// the job recovered into the same divergence again and again.
TEST(DevicePathRunTest, WireSendFailedThenDeviceRecvTimedOut_FailsWithTheSendsCode) {
  const Dataset data = MakeDataset();
  v1::Program program = TwoStageDevicePrograms()[0];
  for (v1::Instruction& in : *program.mutable_instructions()) {
    if (in.has_send()) in.mutable_send()->set_path(v1::LINK_PATH_WIRE);
  }
  ReceiveBegan began;
  DivergedSendsTransport transport(&began);
  TimedOutChannel channel(&began);
  StageSetup setup = TwoStageSetup(program);
  setup.device_channel = &channel;
  auto runtime = StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  absl::StatusOr<IterationResult> result = (*runtime)->RunIteration(0);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "training diverged")) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "nothing from stage 1"))
      << result.status();
}

// A channel's error fails the iteration, naming the send.
TEST(DevicePathRunTest, ChannelError_FailsTheIterationNamingTheSend) {
  const Dataset data = MakeDataset();
  const std::vector<v1::Program> programs = TwoStageDevicePrograms();
  InProcessFabric fabric(2);
  auto transport = fabric.Connect(0);
  RefusingChannel channel;
  StageSetup setup = TwoStageSetup(programs[0]);
  setup.device_channel = &channel;
  auto runtime = StageRuntime::Create(setup, &data, transport.get());
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  absl::StatusOr<IterationResult> result = (*runtime)->RunIteration(0);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "send of ACTIVATION of unit 2"))
      << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "ncclSend failed")) << result.status();
}

}  // namespace
}  // namespace pipetrain
