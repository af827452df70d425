// Device discovery. Runs on any machine: without a GPU (development, CI) it
// checks that "no device" is a count of 0, not an error; with one, it checks
// the reported facts.
#include "kernels/cuda/device.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

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

// The build's kernels are sm_90 code with compute_90 PTX: a later GPU
// JITs the PTX, an earlier one has no image, and is refused up front.
TEST(CheckKernelsRunOnTest, ComputeCapability_RefusedBelowTheBuildsOnly) {
  CudaDeviceInfo device;
  device.index = 1;
  device.name = "NVIDIA A100-SXM4-80GB";
  for (const auto& [major, minor] :
       std::vector<std::pair<int, int>>{{9, 0}, {9, 9}, {10, 0}, {12, 0}}) {
    device.compute_major = major;
    device.compute_minor = minor;
    EXPECT_TRUE(CheckKernelsRunOn(device).ok()) << major << "." << minor;
  }
  device.compute_major = 8;
  device.compute_minor = 9;
  const absl::Status refused = CheckKernelsRunOn(device);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("CUDA device 1 (NVIDIA A100-SXM4-80GB) has compute "
                                   "capability 8.9; this build's kernels need 9.0 or later"),
            std::string::npos)
      << refused;
  device.compute_major = 0;  // what an unfilled info says
  EXPECT_EQ(CheckKernelsRunOn(device).code(), absl::StatusCode::kFailedPrecondition);
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
    // "0000:3B:00.0": domain, bus, device, function.
    EXPECT_EQ(std::count(info->pci_bus_id.begin(), info->pci_bus_id.end(), ':'), 2)
        << info->pci_bus_id;
    EXPECT_NE(info->pci_bus_id.find('.'), std::string::npos) << info->pci_bus_id;
    // Recorded in the test log: which device the parity tests ran on.
    std::cout << "device " << i << ": " << info->name << ", "
              << info->total_memory_bytes / (1 << 20) << " MiB, " << info->sm_count
              << " SMs, compute " << info->compute_major << "." << info->compute_minor << ", "
              << "PCI " << info->pci_bus_id << "\n";
  }
}

}  // namespace
}  // namespace pipetrain
