// Device discovery. Runs on any machine: without a GPU (development, CI) it
// checks that "no device" is a count of 0, not an error; with one, it checks
// the reported facts.
#include "kernels/cuda/device.h"

#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(CudaDeviceCountTest, CudaDeviceCount_AnyMachine_OkAndNonNegative) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_GE(*count, 0);
}

TEST(CudaDeviceCountTest, CudaDeviceCount_CalledTwice_SameCount) {
  const absl::StatusOr<int> first = CudaDeviceCount();
  const absl::StatusOr<int> second = CudaDeviceCount();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
}

TEST(GetCudaDeviceInfoTest, GetCudaDeviceInfo_NegativeIndex_InvalidArgument) {
  const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(-1);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("CUDA device index -1"), std::string::npos)
      << info.status();
}

TEST(GetCudaDeviceInfoTest, GetCudaDeviceInfo_IndexPastCount_NotFoundNamingIndex) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  // On a machine without a GPU this is device 0.
  const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(*count);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(info.status().message().find("CUDA device " + std::to_string(*count) + " not found"),
            std::string::npos)
      << info.status();
}

TEST(GetCudaDeviceInfoTest, GetCudaDeviceInfo_EveryDevice_PlausibleFacts) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  if (*count == 0) GTEST_SKIP() << "no CUDA device";
  for (int i = 0; i < *count; ++i) {
    const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(i);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->index, i);
    EXPECT_FALSE(info->name.empty());
    EXPECT_GT(info->total_memory_bytes, 0);
    EXPECT_GT(info->sm_count, 0);
    EXPECT_GE(info->compute_major, 1);
    EXPECT_EQ(info->uuid.size(), 40u) << info->uuid;
    // Recorded in the test log: which device the parity tests ran on.
    std::cout << "device " << i << ": " << info->name << ", "
              << info->total_memory_bytes / (1 << 20) << " MiB, " << info->sm_count
              << " SMs, compute " << info->compute_major << "." << info->compute_minor << ", "
              << info->uuid << "\n";
  }
}

TEST(FormatGpuUuidTest, SixteenBytes_NvidiaSmiForm) {
  const unsigned char bytes[16] = {0x5e, 0x6f, 0x1a, 0x2b, 0x0c, 0x3d, 0x4e, 0x5f,
                                   0x8a, 0x9b, 0x0c, 0x1d, 0x2e, 0x3f, 0x4a, 0xff};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-5e6f1a2b-0c3d-4e5f-8a9b-0c1d2e3f4aff");
  const unsigned char zeros[16] = {};
  EXPECT_EQ(FormatGpuUuid(zeros), "GPU-00000000-0000-0000-0000-000000000000");
}

}  // namespace
}  // namespace pipetrain
