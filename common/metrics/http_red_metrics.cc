#include "common/metrics/http_red_metrics.h"

#include "absl/strings/str_cat.h"
#include "common/metrics/latency_buckets.h"

namespace pipetrain {
namespace {

bool IsKnownMethod(absl::string_view method) {
  for (absl::string_view known : {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}) {
    if (method == known) return true;
  }
  return false;
}

}  // namespace

HttpRedMetrics::HttpRedMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("pipetrain_http_requests_total")
                    .Help("HTTP requests answered by this server, by method, route pattern "
                          "(route=\"unmatched\": none matched; route=\"rejected\": refused "
                          "before routing) and status code")
                    .Register(registry)),
      duration_(prometheus::BuildHistogram()
                    .Name("pipetrain_http_request_duration_seconds")
                    .Help("HTTP requests answered by this server, from the complete request "
                          "(its wait for a handler included) to the response, seconds, by "
                          "method, route and status code")
                    .Register(registry)) {}

void HttpRedMetrics::AddRoute(const std::string& method, const std::string& route) {
  routes_.insert(route);
  const prometheus::Labels labels = {{"method", method}, {"route", route}, {"code", "200"}};
  requests_.Add(labels);
  duration_.Add(labels, RequestLatencyBuckets());
}

void HttpRedMetrics::DeclareRoutes(const HttpServer& server) {
  for (const auto& [method, route] : server.Routes()) AddRoute(method, route);
  routes_.insert(HttpServer::kUnmatchedRoute);
  routes_.insert(HttpServer::kRejectedRoute);
}

std::function<void(const std::string&, const std::string&, int, double)>
HttpRedMetrics::Observer() {
  return [this](const std::string& method, const std::string& route, int status, double seconds) {
    Observe(method, route, status, seconds);
  };
}

void HttpRedMetrics::Observe(absl::string_view method, absl::string_view route, int status,
                             double seconds) {
  const bool known_route = routes_.find(route) != routes_.end();
  const prometheus::Labels labels = {
      {"method", IsKnownMethod(method) ? std::string(method) : std::string(kOther)},
      {"route", known_route ? std::string(route) : std::string(kOther)},
      {"code", absl::StrCat(status)}};
  requests_.Add(labels).Increment();
  duration_.Add(labels, RequestLatencyBuckets()).Observe(seconds);
}

}  // namespace pipetrain
