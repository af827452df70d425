// The CUDA backend's device-group channel (nccl_device_channel.h). What a
// machine can show, plainly: without a GPU every case skips (CI); on one GPU
// the argument checks run, and the exchange between two backends cannot
// (NCCL refuses two ranks of one communicator on one GPU), so it skips; on
// two or more GPUs two backends on GPUs 0 and 1, one thread each, exchange
// tensors both ways through the group and must get them exactly, in order,
// also when both send first, and an abort ends a receive whose sender never
// sends.
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/parity_testing.h"
#include "worker/model/backend_select.h"
#include "worker/model/cuda_backend.h"
#include "worker/model/two_gpu_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

class NcclDeviceChannelTest : public testing::CudaTest {};

TEST_F(NcclDeviceChannelTest, JoinDeviceGroup_BadStagesOrId_InvalidArgumentBeforeNccl) {
  auto backend = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  auto not_member = (*backend)->JoinDeviceGroup({id, {0, 1}, {{0, 1}}}, 2);
  EXPECT_EQ(not_member.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(not_member.status().message(), "does not include stage 2"))
      << not_member.status();
  auto short_id = (*backend)->JoinDeviceGroup({"not an id", {0, 1}, {{0, 1}}}, 0);
  EXPECT_EQ(short_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(short_id.status().message(), "NcclUniqueId::FromBytes"))
      << short_id.status();
  auto id_again = (*backend)->NewDeviceGroupId();
  ASSERT_TRUE(id_again.ok()) << id_again.status();
  EXPECT_EQ(id_again->size(), id.size());
  EXPECT_NE(*id_again, id);
}

// Stage 0 on GPU 0 sends `kRounds` activations down; stage 1 on GPU 1 sends
// as many gradients up, interleaved as in 1F1B. Each side receives into
// tensors of the shape it names and must see the peer's values exactly.
TEST_F(NcclDeviceChannelTest, TwoGpus_ExchangeBothWays_ExactAndInOrder) {
  SKIP_UNLESS_TWO_GPUS();
  constexpr int kRounds = 5;
  const Shape shape{3, 33, 64};  // off every block size
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  std::vector<std::vector<std::vector<float>>> received(2);
  std::vector<absl::Status> errors(2);
  auto values = [&](int stage, int round) {
    return RandomNormal(100 * stage + round, NumElements(shape), 0.0f, 1.0f);
  };
  auto run = [&](int stage) {
    errors[stage] = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCudaBackend(stage, GemmMode::kFp32));
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceChannel> channel,
                       backend->JoinDeviceGroup({id, {0, 1}, {{0, 1}, {1, 0}}}, stage));
      const int peer = 1 - stage;
      for (int round = 0; round < kRounds; ++round) {
        Tensor host = Tensor::Zeros(shape);
        const std::vector<float> v = values(stage, round);
        std::copy(v.begin(), v.end(), host.data());
        Tensor mine = backend->Upload(host);
        // Stage 0 sends first, stage 1 receives first: 1F1B's order.
        if (stage == 0) RETURN_IF_ERROR(channel->Send(peer, mine));
        ASSIGN_OR_RETURN(Tensor theirs, channel->Recv(peer, shape));
        if (stage == 1) RETURN_IF_ERROR(channel->Send(peer, mine));
        received[stage].push_back(backend->Download(theirs).ToVector());
        RETURN_IF_ERROR(backend->status());
      }
      backend->Synchronize();
      return backend->status();
    }();
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  for (int stage = 0; stage < 2; ++stage) {
    ASSERT_TRUE(errors[stage].ok()) << "stage " << stage << ": " << errors[stage];
    ASSERT_EQ(received[stage].size(), static_cast<size_t>(kRounds));
    for (int round = 0; round < kRounds; ++round) {
      EXPECT_TRUE(AllClose(absl::StrCat("stage ", stage, " round ", round), received[stage][round],
                           values(1 - stage, round), 0.0f, 0.0f));
    }
  }
}

// Both stages send before they receive: the channel's links were connected
// while joining (the warm-up), so neither send waits on the host for the
// peer's receive, and each link has its own stream, so neither waits on the
// device behind the other's.
TEST_F(NcclDeviceChannelTest, TwoGpus_BothSendFirst_NoDeadlock) {
  SKIP_UNLESS_TWO_GPUS();
  const Shape shape{2, 1000, 513};  // 4 MiB: above NCCL's eager buffers
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  std::vector<std::vector<float>> received(2);
  auto values = [&](int stage) { return RandomNormal(7 + stage, NumElements(shape), 0.0f, 1.0f); };
  const std::vector<absl::Status> errors = testing::OnBothRanks([&](int stage) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCudaBackend(stage, GemmMode::kFp32));
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceChannel> channel,
                     backend->JoinDeviceGroup({id, {0, 1}, {{0, 1}, {1, 0}}}, stage));
    Tensor mine = backend->Upload(Tensor::FromVector(shape, values(stage)));
    RETURN_IF_ERROR(channel->Send(1 - stage, mine));
    ASSIGN_OR_RETURN(Tensor theirs, channel->Recv(1 - stage, shape));
    received[stage] = backend->Download(theirs).ToVector();
    return backend->status();
  });
  for (int stage = 0; stage < 2; ++stage) {
    ASSERT_TRUE(errors[stage].ok()) << "stage " << stage << ": " << errors[stage];
    EXPECT_TRUE(
        AllClose(absl::StrCat("stage ", stage), received[stage], values(1 - stage), 0.0f, 0.0f));
  }
}

// Stage 1 receives from stage 0, which never sends: Abort (as a stopped job
// does; every member aborts, as NCCL wants inside a node) ends the waiting
// kernel, so the compute stream behind it goes on, and later calls fail
// with ABORTED.
TEST_F(NcclDeviceChannelTest, TwoGpus_AbortEndsAReceiveThatNeverCompletes) {
  SKIP_UNLESS_TWO_GPUS();
  const Shape shape{4, 64};
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  const std::vector<absl::Status> errors = testing::OnBothRanks([&](int stage) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCudaBackend(stage, GemmMode::kFp32));
    DeviceGroupSpec group{id, {0, 1}, {{0, 1}}};
    group.drain_timeout = absl::Seconds(30);
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceChannel> channel,
                     backend->JoinDeviceGroup(group, stage));
    if (stage == 1) {
      ASSIGN_OR_RETURN(Tensor never, channel->Recv(0, shape));
      std::thread stopper([&] { channel->Abort(); });
      backend->Synchronize();  // returns once the abort ended the receive
      stopper.join();
      ASSIGN_OR_RETURN(Tensor again, channel->Recv(0, shape));  // must fail
      return absl::InternalError("Recv after Abort succeeded");
    }
    channel->Abort();
    const absl::Status after = channel->Send(1, backend->Zeros(shape));
    if (after.code() != absl::StatusCode::kAborted) {
      return absl::InternalError(absl::StrCat("Send after Abort: ", after.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(errors[0].ok()) << errors[0];
  EXPECT_EQ(errors[1].code(), absl::StatusCode::kAborted) << errors[1];
}

}  // namespace
}  // namespace pipetrain
