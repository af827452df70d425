// What a coordinator that is not the leader serves on its HTTP port
// (highly available coordinators, DESIGN.md §11), beside FollowerService
// on its gRPC port, until it wins the election and the leader's HTTP
// server takes the port:
//   /healthz  200: the process is alive (a liveness probe keeps it);
//   /readyz   503 naming why (ServingHealth: it follows);
//   /metrics  pipetrain_build_info, the process metrics and the expiry of
//             the TLS files it serves with, so a scrape sees the standby up
//             (PipetrainCoordinatorDown stays quiet), which build it runs,
//             and a certificate of its own expiring before it takes over;
//   /v1/...   every REST path, GET or POST: 503 UNAVAILABLE naming the
//             leader (after the user token, as on the leader); a leader
//             still loading its state says so instead.
// Thread-safe once serving, as HttpServer's handlers must be.
#ifndef PIPETRAIN_COORDINATOR_API_FOLLOWER_HTTP_H_
#define PIPETRAIN_COORDINATOR_API_FOLLOWER_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/http_server.h"
#include "common/metrics/collectable_list.h"
#include "common/metrics/process_collector.h"
#include "common/serving_health.h"
#include "common/tls_credentials.h"
#include "prometheus/registry.h"

namespace pipetrain {

// A follower's /metrics: pipetrain_build_info, the process metrics and
// pipetrain_tls_certificate_expiry_timestamp_seconds for `certificates`
// (none without TLS).
class FollowerMetrics {
 public:
  explicit FollowerMetrics(const std::vector<TlsCertificateExpiry>& certificates = {});
  const prometheus::Collectable* collectable() const { return &exposition_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  ProcessCollector process_;
  CollectableList exposition_;
};

// Registers the routes above on `server` (not started yet). `health` and
// `metrics` must outlive it; `leader` returns the leader's address, ""
// while none is elected, `leading` whether this coordinator is that leader
// (loading its state); both must be thread-safe.
void ServeFollowerHttp(HttpServer& server, const ServingHealth* health,
                       std::function<std::string()> leader, std::function<bool()> leading,
                       const FollowerMetrics* metrics);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_FOLLOWER_HTTP_H_
