// What a worker reports at registration, on the CPU backend (the GPU fields
// come from the CUDA backend's facts; cuda_backend_test covers those).
#include "worker/agent/device_info.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(DeviceInfoTest, CollectDeviceInfo_CpuBackend_NoGpuFieldsAndMeasuredGemm) {
  const v1::DeviceInfo info = CollectDeviceInfo(CpuBackend());
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.gpu_model(), "");
  EXPECT_EQ(info.gpu_memory_bytes(), 0);
  EXPECT_EQ(info.gpu_sm_count(), 0);
  EXPECT_EQ(info.gpu_pci_bus_id(), "");
  EXPECT_GT(info.cpu_cores(), 0);
  EXPECT_GT(info.memory_bytes(), 0);
  EXPECT_GT(info.measured_gflops(), 0.0);
}

}  // namespace
}  // namespace pipetrain
