// RED metrics (rate, errors, duration) of an HTTP server's routes, fed by
// the server's response observer (HttpServer::Options::on_response):
//
//   HttpServer http({.on_response = red.Observer()});
//   http.Get(...); ...
//   red.DeclareRoutes(http);  // before Start
//
//
//   pipetrain_http_requests_total{method,route,code}          counter
//   pipetrain_http_request_duration_seconds{method,route,code} histogram
//
// route is the pattern the request matched, as registered ("/v1/jobs",
// "/v1/jobs/([^/:]+)/plan"), never the path itself, so job ids stay out of
// the labels; code is the HTTP status ("200", "404"). A route not declared
// with AddRoute count as route="other", except the server's own bounded
// labels for requests that matched no route ("unmatched") or that its gate
// answered ("rejected"); a declared route asked with another method keeps
// its route label (a 405); methods other than the usual verbs count as
// method="other". Every declared
// route has its code="200" series from the start, at zero.
//
// Thread-safe (prometheus-cpp metrics are). Requires: AddRoute is called
// before the first Observe (the route table is then read without a lock).
// The registry must outlive this object.
#ifndef PIPETRAIN_COMMON_METRICS_HTTP_RED_METRICS_H_
#define PIPETRAIN_COMMON_METRICS_HTTP_RED_METRICS_H_

#include <functional>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "common/http_server.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pipetrain {

class HttpRedMetrics {
 public:
  static constexpr absl::string_view kOther = "other";

  explicit HttpRedMetrics(prometheus::Registry& registry);
  HttpRedMetrics(const HttpRedMetrics&) = delete;
  HttpRedMetrics& operator=(const HttpRedMetrics&) = delete;

  // Declares `method` `route` (e.g. "GET", "/v1/jobs") and creates its
  // code="200" series at zero.
  void AddRoute(const std::string& method, const std::string& route);

  // AddRoute for every route `server` has, and accepts its unmatched and
  // rejected labels. Requires: `server` not started yet.
  void DeclareRoutes(const HttpServer& server);

  // One request to `route` with `method` was answered `status` after
  // `seconds`.
  void Observe(absl::string_view method, absl::string_view route, int status, double seconds);

  // For HttpServer::Options::on_response: calls Observe. This object must
  // outlive the server.
  std::function<void(const std::string&, const std::string&, int, double)> Observer();

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& duration_;
  std::set<std::string, std::less<>> routes_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_HTTP_RED_METRICS_H_
