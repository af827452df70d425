// A small HTTP server for REST endpoints and /metrics, over cpp-httplib.
//
//   HttpServer server({.bearer_token = token});
//   server.Get(R"(/v1/jobs/([^/:]+))", [&](const HttpRequest& r) {
//     return JsonResponse(200, Lookup(r.path_params[0]));
//   });
//   ServePrometheus(server, &registry);
//   absl::StatusOr<int> port = server.Start("127.0.0.1", 0);  // 0: any port
//   ...
//   server.Stop();
//
// Routes are regular expressions matched against the whole path (httplib's
// std::regex); capture groups arrive as HttpRequest::path_params. A request
// that matches no route gets 404 with a JSON error body. Handlers run on the
// server's own thread pool, concurrently: they must be thread-safe.
//
// Authentication: when Options::bearer_token is set, every route except the
// public paths (/healthz, /metrics) requires "Authorization: Bearer <token>";
// others get 401 {"code":"UNAUTHENTICATED","message":...}. Tokens travel in
// clear text: bind to loopback or put a TLS proxy in front.
#ifndef PIPETRAIN_COMMON_HTTP_SERVER_H_
#define PIPETRAIN_COMMON_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace pipetrain {

struct HttpRequest {
  std::string method;  // "GET", "POST"
  std::string path;    // without the query string
  std::string body;
  std::vector<std::string> path_params;  // the route's capture groups, in order
  std::map<std::string, std::string> query;  // first value of each parameter
};

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// `status` with `body` as application/json.
HttpResponse JsonResponse(int status, std::string body);
// The error body every endpoint uses: {"code": "<CODE>", "message": "..."},
// e.g. code "INVALID_ARGUMENT". The message is JSON-escaped.
HttpResponse JsonError(int status, absl::string_view code, absl::string_view message);

class HttpServer {
 public:
  struct Options {
    // Empty: no authentication.
    std::string bearer_token;
    // Paths served without a token (exact match), for probes and scrapers.
    std::set<std::string> public_paths = {"/healthz", "/metrics"};
  };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer();
  explicit HttpServer(Options options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Register a handler for `pattern` (a regular expression for the whole
  // path). Requires: Start has not been called (routes are not guarded by a
  // lock). The first registered pattern that matches wins.
  void Get(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, Handler handler);

  // Binds host:port (port 0: any free port), starts serving on threads of
  // its own and returns the bound port once the server accepts connections.
  // Requires: not started yet (checked).
  // Errors: UNAVAILABLE when the address cannot be bound (in use, not a local
  // address); the message names host:port.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Stops accepting, waits for in-flight requests and joins the threads.
  // Idempotent; safe to call when never started. A stopped server cannot be
  // started again. Not to be called from a handler (it would wait for itself).
  void Stop();

  // The bound port after a successful Start, else 0.
  int port() const { return port_; }

 private:
  void Route(const std::string& method, const std::string& pattern, Handler handler);
  void InstallHooks();

  const Options options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  int port_ = 0;
  bool started_ = false;
};

// Registers GET /metrics, serving `collectable->Collect()` (usually a
// prometheus::Registry) in the Prometheus text format 0.0.4. `before_collect`,
// if set, runs first on each scrape (to refresh gauges from their source);
// it must be thread-safe, as scrapes may be concurrent. `collectable` is not
// owned and must outlive the server. Requires: server not started.
void ServePrometheus(HttpServer& server, const prometheus::Collectable* collectable,
                     std::function<void()> before_collect = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_HTTP_SERVER_H_
