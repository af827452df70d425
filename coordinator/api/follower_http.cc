#include "coordinator/api/follower_http.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/build_info_metric.h"
#include "common/metrics/tls_expiry_metric.h"

namespace pipetrain {

FollowerMetrics::FollowerMetrics(const std::vector<TlsCertificateExpiry>& certificates)
    : registry_(std::make_shared<prometheus::Registry>()),
      exposition_({registry_.get(), &process_}) {
  AddBuildInfo(*registry_);
  // A standby serves gRPC with its own certificate already: it must not
  // expire unseen until the standby takes over.
  AddTlsCertificateExpiry(*registry_, certificates);
}

void ServeFollowerHttp(HttpServer& server, const ServingHealth* health,
                       std::function<std::string()> leader, std::function<bool()> leading,
                       const FollowerMetrics* metrics) {
  ServeHealthEndpoints(server, health);
  ServePrometheus(server, metrics->collectable());
  const auto refuse = [leader = std::move(leader),
                       leading = std::move(leading)](const HttpRequest&) {
    // Not "the leader is" this very address: the caller would look elsewhere.
    if (leading()) {
      return JsonError(503, "UNAVAILABLE",
                       "this coordinator leads and is still loading its state; retry shortly");
    }
    const std::string address = leader();
    return JsonError(503, "UNAVAILABLE",
                     address.empty()
                         ? std::string("this coordinator follows and no leader is elected yet; "
                                       "retry shortly")
                         : absl::StrCat("this coordinator follows; the leader's gRPC address is ",
                                        address, " (its REST API is on its --http-address)"));
  };
  server.Get("/v1/.*", refuse);
  server.Post("/v1/.*", refuse);
}

}  // namespace pipetrain
