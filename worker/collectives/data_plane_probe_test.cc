#include "worker/collectives/data_plane_probe.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/testing/test_certificates.h"
#include "gtest/gtest.h"
#include "worker/transport/data_plane_tls.h"

namespace pipetrain {
namespace {

TEST(FitDataPlaneCostTest, RecoversTheLineThroughBothPoints) {
  // 50 us + 2 GB/s: 4 KiB takes 52.048 us, 1 MiB 574.288 us.
  const double rate = 2e9, overhead = 50e-6;
  const int64_t small = 4096, large = 1 << 20;
  absl::StatusOr<DataPlaneCost> cost =
      FitDataPlaneCost(small, overhead + small / rate, large, overhead + large / rate);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_NEAR(cost->bytes_per_second, rate, rate * 1e-9);
  EXPECT_NEAR(cost->overhead_seconds, overhead, 1e-12);
}

TEST(FitDataPlaneCostTest, NoisyTimesStayPositive) {
  // The large message no slower than the small one (noise): its own rate.
  absl::StatusOr<DataPlaneCost> cost = FitDataPlaneCost(4096, 2e-3, 1 << 20, 1e-3);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_DOUBLE_EQ(cost->bytes_per_second, (1 << 20) / 1e-3);
  EXPECT_GT(cost->overhead_seconds, 0);
  // A line through the origin or below it: the overhead's floor, not 0.
  cost = FitDataPlaneCost(4096, 1e-6, 1 << 20, 1e-3);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_GT(cost->overhead_seconds, 0);
}

TEST(FitDataPlaneCostTest, RefusesBadInput) {
  EXPECT_EQ(FitDataPlaneCost(0, 1e-3, 1 << 20, 2e-3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FitDataPlaneCost(1 << 20, 1e-3, 4096, 2e-3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FitDataPlaneCost(4096, 0, 1 << 20, 2e-3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FitDataPlaneCost(4096, 1e-3, 1 << 20, NAN).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProbeDataPlaneTest, MeasuresItsOwnLoopbackAndLeavesNoJobBehind) {
  Mailbox mailbox;
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
      DataPlaneServer::Start("127.0.0.1:0", &mailbox);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<DataPlaneCost> cost =
      ProbeDataPlane(server->get(), &mailbox, "127.0.0.1:" + std::to_string((*server)->port()));
  ASSERT_TRUE(cost.ok()) << cost.status();
  // Loopback on any host: more than nothing, less than a slow network.
  // (The probe's all-reduces check their sums.)
  EXPECT_GT(cost->overhead_seconds, 0);
  EXPECT_LT(cost->overhead_seconds, 1.0);
  EXPECT_GT(cost->bytes_per_second, 1e6);
  EXPECT_TRUE(std::isfinite(cost->bytes_per_second));
  EXPECT_EQ(mailbox.size(), 0u);
  EXPECT_NE(DescribeDataPlaneCost(*cost).find("GB/s per message"), std::string::npos);
}

TEST(ProbeDataPlaneTest, UnreachableSelfIsAnError) {
  Mailbox mailbox;
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
      DataPlaneServer::Start("127.0.0.1:0", &mailbox);
  ASSERT_TRUE(server.ok()) << server.status();
  // Port 1 on loopback: nothing listens there.
  const absl::Status probed = ProbeDataPlane(server->get(), &mailbox, "127.0.0.1:1").status();
  EXPECT_EQ(probed.code(), absl::StatusCode::kUnavailable) << probed;
  EXPECT_NE(probed.message().find("127.0.0.1:1"), absl::string_view::npos) << probed;
  EXPECT_EQ(mailbox.size(), 0u);
}

// A worker with data-plane TLS measures through its own TLS port: the
// probe dials with the worker's credentials (plaintext could not connect).
TEST(ProbeDataPlaneTest, OverTls_MeasuresWithTheWorkersCredentials) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::StatusOr<testing::TestCertificates> certs =
      testing::MakeTestCertificates(tmp != nullptr ? tmp : "/tmp");
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<DataPlaneTls> tls =
      DataPlaneTlsFromFlags(certs->server_cert, certs->server_key, certs->ca, "");
  ASSERT_TRUE(tls.ok()) << tls.status();
  Mailbox mailbox;
  absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
      DataPlaneServer::Start("127.0.0.1:0", &mailbox, nullptr, {}, tls->server);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string self = "127.0.0.1:" + std::to_string((*server)->port());
  absl::StatusOr<DataPlaneCost> cost =
      ProbeDataPlane(server->get(), &mailbox, self, tls->channel, tls->server_name);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_GT(cost->bytes_per_second, 1e6);
  EXPECT_EQ(mailbox.size(), 0u);
}

}  // namespace
}  // namespace pipetrain
