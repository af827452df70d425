// What a worker reports at registration, on the CPU backend (the GPU fields
// come from the CUDA backend's facts; cuda_backend_test covers those).
#include "worker/agent/device_info.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/blas.h"

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
  EXPECT_EQ(info.compute_threads(), BlasThreads());  // on the CPU: its BLAS threads
  EXPECT_GT(info.memory_bytes(), 0);
  EXPECT_GT(info.memory_limit_bytes(), 0);
  EXPECT_LE(info.memory_limit_bytes(), info.memory_bytes());
  EXPECT_GT(info.measured_gflops(), 0.0);
  EXPECT_EQ(info.mailbox_limit_bytes(), 0);  // not set: not reported
}

// The worker's --mailbox-limit reaches the coordinator, which plans no
// tensor above it (DeviceInfo.mailbox_limit_bytes).
TEST(DeviceInfoTest, CollectDeviceInfo_MailboxLimitSet_Reported) {
  SetReportedMailboxLimit(int64_t{1} << 30);
  EXPECT_EQ(CollectDeviceInfo(CpuBackend()).mailbox_limit_bytes(), int64_t{1} << 30);
  SetReportedMailboxLimit(0);
}

// A fake cgroup tree under TEST_TMPDIR.
std::string FakeCgroup(const std::string& name, const std::string& self, const std::string& file,
                       const std::string& value) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  const std::string dir = root + file.substr(0, file.rfind('/'));
  EXPECT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(root + file) << value << "\n";
  std::ofstream(root + "/self") << self;
  return root;
}

TEST(CgroupMemoryLimitTest, V2LimitOrMax) {
  std::string root =
      FakeCgroup("v2", "0::/kubepods/pod1\n", "/kubepods/pod1/memory.max", "2147483648");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), int64_t{2147483648});
  root = FakeCgroup("v2max", "0::/a\n", "/a/memory.max", "max");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), 0);
}

TEST(CgroupMemoryLimitTest, V1LimitOrUnlimited) {
  std::string root = FakeCgroup("v1", "9:cpu:/x\n4:memory:/docker/abc\n",
                                "/memory/docker/abc/memory.limit_in_bytes", "536870912");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), int64_t{536870912});
  root =
      FakeCgroup("v1none", "4:memory:/\n", "/memory//memory.limit_in_bytes", "9223372036854771712");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), 0);
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/missing"), 0);
}

// A container without its own cgroup namespace (cgroup v1 nodes): its
// host's path in /proc/self/cgroup, its own cgroup at the top of the mount.
TEST(CgroupMemoryLimitTest, HostPathNotMounted_TheMountsTopIsTheContainers) {
  std::string root = FakeCgroup("v1c", "4:memory:/kubepods/burstable/pod1/c1\n",
                                "/memory/memory.limit_in_bytes", "4294967296");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), int64_t{4294967296});
  root = FakeCgroup("v2c", "0::/kubepods/pod1/c1\n", "/memory.max", "1073741824");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), int64_t{1073741824});
  // The process's own file, where there is one, says: no limit here.
  root = FakeCgroup("v2own", "0::/a\n", "/memory.max", "1073741824");
  FakeCgroup("v2own", "0::/a\n", "/a/memory.max", "max");
  EXPECT_EQ(CgroupMemoryLimit(root, root + "/self"), 0);
}

TEST(ReservedMemoryLimitTest, LimitLessTheReserveLeavingSomething) {
  EXPECT_EQ(ReservedMemoryLimit(4096, 1024).value(), 3072);
  EXPECT_EQ(ReservedMemoryLimit(4096, 0).value(), 4096);
  const absl::StatusOr<int64_t> nothing = ReservedMemoryLimit(4096, 4096);
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nothing.status().message().find("--memory-reserve of 4096 bytes leaves nothing"),
            absl::string_view::npos)
      << nothing.status();
  EXPECT_FALSE(ReservedMemoryLimit(4096, -1).ok());
}

TEST(EffectiveMemoryLimitTest, LeastOfTheNonZero) {
  EXPECT_EQ(EffectiveMemoryLimit(16, 0, 0), 16);
  EXPECT_EQ(EffectiveMemoryLimit(16, 8, 0), 8);
  EXPECT_EQ(EffectiveMemoryLimit(16, 8, 4), 4);
  EXPECT_EQ(EffectiveMemoryLimit(16, 0, 32), 16);
}

}  // namespace
}  // namespace pipetrain
