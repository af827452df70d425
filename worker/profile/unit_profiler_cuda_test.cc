// The unit profiler on a CUDA backend: the profile names the GPU (the key
// the coordinator's profile cache uses) and times every unit. GPU cases SKIP
// without a device.
#include <memory>

#include "gtest/gtest.h"
#include "kernels/cuda/parity_testing.h"
#include "worker/model/cuda_backend.h"
#include "worker/profile/unit_profiler.h"

namespace pipetrain {
namespace {

class UnitProfilerCudaTest : public testing::CudaTest {};

TEST_F(UnitProfilerCudaTest, ProfileUnits_CudaBackend_NamesTheGpuAndTimesEveryUnit) {
  auto cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  v1::ProfileRequest request;
  request.mutable_model()->set_n_layer(2);
  request.mutable_model()->set_n_head(4);
  request.mutable_model()->set_d_model(128);
  request.set_seq_len(64);
  request.set_micro_batch_size(4);
  absl::StatusOr<v1::ModelProfile> profile = ProfileUnits(request, nullptr, cuda->get());
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->device_kind(), "cuda:" + (*cuda)->device_facts().name);
  ASSERT_EQ(profile->units_size(), 6);
  for (const v1::UnitProfile& unit : profile->units()) {
    EXPECT_GT(unit.fwd_seconds(), 0.0) << unit.name();
    EXPECT_GT(unit.bwd_seconds(), 0.0) << unit.name();
  }
}

}  // namespace
}  // namespace pipetrain
