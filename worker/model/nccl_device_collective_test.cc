// The CUDA backend's replica collective (nccl_device_collective.h). What a
// machine can show, plainly: without a GPU every case skips (CI); on one GPU
// the argument checks run, and the sums between two backends cannot (NCCL
// refuses two ranks of one communicator on one GPU), so they skip; on two
// or more GPUs two backends on GPUs 0 and 1, one thread each, sum tensors
// (several as one flat sum, one in place) and must both get a + b exactly
// (two members: every order gives the same floats), read by compute work
// queued after AwaitSums; an abort ends a sum whose peer never comes.
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

class NcclDeviceCollectiveTest : public testing::CudaTest {};

TEST_F(NcclDeviceCollectiveTest, JoinDeviceCollective_BadSpecOrId_InvalidArgumentBeforeNccl) {
  auto backend = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  DeviceCollectiveSpec alone{id, 1, 0};
  EXPECT_EQ((*backend)->JoinDeviceCollective(alone).status().code(),
            absl::StatusCode::kInvalidArgument);
  DeviceCollectiveSpec no_rank{id, 2, 2};
  auto outside = (*backend)->JoinDeviceCollective(no_rank);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(outside.status().message(), "no rank 2")) << outside.status();
  DeviceCollectiveSpec short_id{"not an id", 2, 0};
  auto bad = (*backend)->JoinDeviceCollective(short_id);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "NcclUniqueId::FromBytes")) << bad.status();
}

// Two gradients summed as one flat sum, then one in place, three rounds;
// the sums are read by a download queued after AwaitSums.
TEST_F(NcclDeviceCollectiveTest, TwoGpus_SumsExactlyOnEveryMember) {
  SKIP_UNLESS_TWO_GPUS();
  constexpr int kRounds = 3;
  const std::vector<Shape> shapes = {{33, 65}, {7}, {3, 1000, 129}};  // off every block size
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  auto values = [&](int rank, int round, int k) {
    return RandomNormal(1000 * rank + 10 * round + k, NumElements(shapes[k]), 0.0f, 1.0f);
  };
  std::vector<std::vector<std::vector<float>>> got(2);  // [rank][round * 3 + k]
  const std::vector<absl::Status> errors = testing::OnBothRanks([&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCudaBackend(rank, GemmMode::kFp32));
    DeviceCollectiveSpec spec{id, 2, rank};
    spec.drain_timeout = absl::Seconds(30);
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceCollective> collective,
                     backend->JoinDeviceCollective(spec));
    for (int round = 0; round < kRounds; ++round) {
      std::vector<Tensor> t;
      for (int k = 0; k < 3; ++k) {
        t.push_back(backend->Upload(Tensor::FromVector(shapes[k], values(rank, round, k))));
      }
      RETURN_IF_ERROR(collective->AllReduceSum({&t[0], &t[1]}));
      RETURN_IF_ERROR(collective->AllReduceSum({&t[2]}));
      RETURN_IF_ERROR(collective->AwaitSums());
      for (int k = 0; k < 3; ++k) got[rank].push_back(backend->Download(t[k]).ToVector());
      RETURN_IF_ERROR(backend->status());
    }
    return collective->Flush(absl::Seconds(30), nullptr);
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[rank].ok()) << "rank " << rank << ": " << errors[rank];
    ASSERT_EQ(got[rank].size(), static_cast<size_t>(3 * kRounds));
    for (int round = 0; round < kRounds; ++round) {
      for (int k = 0; k < 3; ++k) {
        std::vector<float> want = values(0, round, k);
        const std::vector<float> other = values(1, round, k);
        for (size_t i = 0; i < want.size(); ++i) want[i] += other[i];
        EXPECT_TRUE(AllClose(absl::StrCat("rank ", rank, " round ", round, " tensor ", k),
                             got[rank][3 * round + k], want, 0.0f, 0.0f));
      }
    }
  }
}

// Rank 1 sums, rank 0 never does: Abort (as a stopped job does) ends the
// waiting sum, so compute queued behind it goes on, and later calls fail
// with ABORTED.
TEST_F(NcclDeviceCollectiveTest, TwoGpus_AbortEndsASumThatNeverCompletes) {
  SKIP_UNLESS_TWO_GPUS();
  const std::string id = NcclUniqueId::Create().value().ToBytes();
  const std::vector<absl::Status> errors = testing::OnBothRanks([&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCudaBackend(rank, GemmMode::kFp32));
    DeviceCollectiveSpec spec{id, 2, rank};
    spec.drain_timeout = absl::Seconds(30);
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceCollective> collective,
                     backend->JoinDeviceCollective(spec));
    if (rank == 1) {
      Tensor t = backend->Zeros({4, 64});
      RETURN_IF_ERROR(collective->AllReduceSum({&t}));
      RETURN_IF_ERROR(collective->AwaitSums());
      std::thread stopper([&] { collective->Abort(); });
      backend->Synchronize();  // returns once the abort ended the sum
      stopper.join();
      return collective->AllReduceSum({&t});  // must fail
    }
    collective->Abort();
    Tensor t = backend->Zeros({4});
    const absl::Status after = collective->AllReduceSum({&t});
    if (after.code() != absl::StatusCode::kAborted) {
      return absl::InternalError(absl::StrCat("AllReduceSum after Abort: ", after.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(errors[0].ok()) << errors[0];
  EXPECT_EQ(errors[1].code(), absl::StatusCode::kAborted) << errors[1];
}

}  // namespace
}  // namespace pipetrain
