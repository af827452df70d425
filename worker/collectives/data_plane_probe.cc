#include "worker/collectives/data_plane_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data_plane_keys.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "worker/collectives/collectives.h"
#include "worker/transport/grpc_transport.h"

namespace pipetrain {
namespace {

constexpr int kWarmUps = 2;  // connect, first allocations
constexpr int kRounds = 12;  // each one all-reduce of either size
constexpr double kOverheadFloorSeconds = 1e-6;

// Both members all-reduce a tensor of step_bytes (member 1 on its own
// thread): with two members that is one exchange of the whole tensor each
// way (Collectives::AllReduce), the one step the cost model times. The
// seconds until both are done; INTERNAL when a member sent other than
// step_bytes, so that a change of the two-member algorithm cannot skew the
// fit unnoticed (it did once: when two members still ran the ring, the
// probe all-reduced 2 * step_bytes and halved the time).
absl::StatusOr<double> StepSeconds(Collectives& first, Collectives& second, int64_t step_bytes,
                                   int64_t iteration) {
  const Shape shape{step_bytes / static_cast<int64_t>(sizeof(float))};
  Tensor a = Tensor::Filled(shape, 1.0f), b = Tensor::Filled(shape, 2.0f);
  const int64_t first_sent = first.sent_bytes(), second_sent = second.sent_bytes();
  absl::Status second_status;
  const auto start = std::chrono::steady_clock::now();
  std::thread other([&] { second_status = second.AllReduce(iteration, 0, b); });
  absl::Status first_status = first.AllReduce(iteration, 0, a);
  other.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RETURN_IF_ERROR(first_status);
  RETURN_IF_ERROR(second_status);
  if (a[0] != 3.0f || b[shape[0] - 1] != 3.0f) {
    return absl::InternalError("the data plane probe's all-reduce summed wrong");
  }
  if (first.sent_bytes() - first_sent != step_bytes ||
      second.sent_bytes() - second_sent != step_bytes) {
    return absl::InternalError(absl::StrCat("the data plane probe's all-reduce of ", step_bytes,
                                            " bytes was not one exchange: the members sent ",
                                            first.sent_bytes() - first_sent, " and ",
                                            second.sent_bytes() - second_sent, " bytes"));
  }
  return seconds;
}

}  // namespace

absl::StatusOr<DataPlaneCost> FitDataPlaneCost(int64_t small_bytes, double small_seconds,
                                               int64_t large_bytes, double large_seconds) {
  if (!(small_bytes > 0 && small_bytes < large_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe sizes must satisfy 0 < ", small_bytes, " < ", large_bytes));
  }
  if (!(small_seconds > 0 && std::isfinite(small_seconds) && large_seconds > 0 &&
        std::isfinite(large_seconds))) {
    return absl::InvalidArgumentError(absl::StrCat("probe times must be positive and finite, got ",
                                                   small_seconds, " and ", large_seconds));
  }
  DataPlaneCost cost;
  cost.bytes_per_second =
      large_seconds > small_seconds
          ? static_cast<double>(large_bytes - small_bytes) / (large_seconds - small_seconds)
          : static_cast<double>(large_bytes) / large_seconds;
  cost.overhead_seconds =
      std::max(kOverheadFloorSeconds,
               small_seconds - static_cast<double>(small_bytes) / cost.bytes_per_second);
  return cost;
}

absl::StatusOr<DataPlaneCost> ProbeDataPlane(DataPlaneServer* server, Mailbox* mailbox,
                                             const std::string& self_address,
                                             std::shared_ptr<grpc::ChannelCredentials> credentials,
                                             const std::string& tls_server_name) {
  // A job nobody else can prove (its secret never leaves this process).
  // Both members send to this one server, which checks them as member 0:
  // each is given its link key to member 0 for both of its peers.
  const std::string job_id = absl::StrCat("data-plane-probe-", RandomHex(8));
  const std::vector<DataPlaneKeys> keys = DeriveDataPlaneKeys(RandomToken(), job_id, 2);
  server->SetJob(job_id, 2, keys[0].receive_key);
  GrpcTransportOptions options0, options1;
  options0.credential = {job_id, {keys[0].send_keys[0], keys[0].send_keys[0]}};
  options1.credential = {job_id, {keys[1].send_keys[0], keys[1].send_keys[0]}};
  for (GrpcTransportOptions* options : {&options0, &options1}) {
    options->connect_timeout = absl::Seconds(5);
    options->channel_credentials = credentials;
    options->tls_server_name = tls_server_name;
  }
  CollectiveOptions exchange;
  exchange.timeout = absl::Seconds(10);
  absl::StatusOr<DataPlaneCost> cost = [&]() -> absl::StatusOr<DataPlaneCost> {
    GrpcTransport t0(0, {self_address, self_address}, mailbox, options0);
    GrpcTransport t1(1, {self_address, self_address}, mailbox, options1);
    Collectives first(&t0, {{0, 1}, job_id}, exchange);
    Collectives second(&t1, {{0, 1}, job_id}, exchange);
    RETURN_IF_ERROR(first.status());
    RETURN_IF_ERROR(second.status());
    int64_t iteration = 0;
    for (int i = 0; i < kWarmUps; ++i) {
      RETURN_IF_ERROR(StepSeconds(first, second, kDataPlaneProbeLargeBytes, iteration++).status());
    }
    // The fastest of each size, the sizes alternating so that both see the
    // same conditions: workers started together probe at once (and beside
    // each other's GEMM probes).
    double small = std::numeric_limits<double>::infinity(), large = small;
    for (int i = 0; i < kRounds; ++i) {
      ASSIGN_OR_RETURN(const double s,
                       StepSeconds(first, second, kDataPlaneProbeSmallBytes, iteration++));
      ASSIGN_OR_RETURN(const double l,
                       StepSeconds(first, second, kDataPlaneProbeLargeBytes, iteration++));
      small = std::min(small, s);
      large = std::min(large, l);
    }
    t0.Shutdown();
    t1.Shutdown();
    return FitDataPlaneCost(kDataPlaneProbeSmallBytes, small, kDataPlaneProbeLargeBytes, large);
  }();
  server->ClearJob();
  mailbox->DropJob(job_id);
  return cost;
}

std::string DescribeDataPlaneCost(const DataPlaneCost& cost) {
  return absl::StrFormat("%.3g ms + %.3g GB/s per message (timed as collective steps)",
                         cost.overhead_seconds * 1e3, cost.bytes_per_second / 1e9);
}

}  // namespace pipetrain
