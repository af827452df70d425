#include "coordinator/jobs/host_gflops.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::Worker Cpu(const std::string& host, int threads, double gflops) {
  v1::Worker w;
  w.mutable_device()->set_hostname(host);
  w.mutable_device()->set_compute_threads(threads);
  w.mutable_device()->set_measured_gflops(gflops);
  return w;
}

// Host-mates with w's thread count lend it their best probe (one probe
// read low while the others probed too); other thread counts, other
// hosts and GPU workers do not (an 8-thread worker made a 1-thread one
// beside it look 8 times as fast).
TEST(HostGflopsTest, BestProbeOfTheHostMatesWithTheSameThreads) {
  const v1::Worker slow_probe = Cpu("h", 1, 30);
  const v1::Worker mate = Cpu("h", 1, 50);
  const v1::Worker wide = Cpu("h", 8, 400);
  const v1::Worker elsewhere = Cpu("g", 1, 90);
  v1::Worker gpu = Cpu("h", 1, 9000);
  gpu.mutable_device()->set_gpu_model("GPU");
  const std::vector<v1::Worker> all = {slow_probe, mate, wide, elsewhere, gpu};
  EXPECT_EQ(HostGflops(all, slow_probe), 50);
  EXPECT_EQ(HostGflops(all, mate), 50);
  EXPECT_EQ(HostGflops(all, wide), 400);
  EXPECT_EQ(HostGflops(all, elsewhere), 90);
  EXPECT_EQ(HostGflops(all, gpu), 9000);
  EXPECT_EQ(HostGflops(all, Cpu("", 1, 10)), 10);  // no host named: its own
}

}  // namespace
}  // namespace pipetrain
