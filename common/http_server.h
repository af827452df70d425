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
// whose path matches no route gets 404 with a JSON error body; one whose
// path matches a route of other methods gets 405 with "Allow: <those>". Handlers run on
// Options::handler_threads threads of the server's own, concurrently: they
// must be thread-safe.
//
// Slow and oversized clients: one gate thread (common/http_gate.h) reads
// every connection without blocking and hands a request to a handler only
// once it is complete, within the limits in Options; it also writes the
// responses. A client that trickles its request, or never reads the answer,
// holds a buffer and a connection slot until its timeout, never a thread, so
// /healthz and /metrics stay answerable. Over a limit the gate answers with
// the JSON error body itself (414, 431, 413, 411, 415, 408, 503; docs/api.md
// "HTTP limits"). One request per connection: every response says
// "Connection: close". A POST without Content-Length has an empty body.
// Compressed request bodies (Content-Encoding) are refused, never inflated;
// Range headers are ignored (every answer is the whole body); a body reaches
// its handler as sent, whatever its Content-Type (multipart not parsed).
// Answers are never compressed (Accept-Encoding is ignored).
//
// Cross-origin requests: a request to any route but the public paths whose
// Origin header names another server than its Host (a web page elsewhere
// calling the API through the user's browser) gets 403
// {"code":7,...}, token or not; clients that send no Origin (curl, the CLI,
// Prometheus) are unaffected.
//
// DNS rebinding: a server without a bearer token (an --insecure
// coordinator), wherever it is bound, answers the routes (not the public
// paths) only for a Host header that is an IP address (IsIpLiteral), names
// loopback (IsLoopbackHost: localhost, *.localhost), or is this machine's
// name or the host as Start was given it; others get 403 {"code":7,...}. A
// web page whose own name an attacker points at this server's address
// would otherwise be same-origin with the API, and pass the Origin check;
// a wildcard socket (0.0.0.0, the Docker image's) listens on loopback and
// every LAN address too. An address cannot be rebound, so clients that
// use one are unaffected. With a token the page gains nothing (it has
// none), so a server with one answers any Host.
//
// Authentication: when Options::bearer_token is set, every route except the
// public paths (/healthz, /readyz, /metrics) requires "Authorization: Bearer <token>";
// others get 401 {"code":16,"message":...,"details":[]}. Tokens travel in
// clear text: bind to loopback or put a TLS proxy in front.
#ifndef PIPETRAIN_COMMON_HTTP_SERVER_H_
#define PIPETRAIN_COMMON_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/http_response.h"  // HttpResponse, JsonResponse, JsonError

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace pipetrain {

class FixedThreadPool;
class HttpGate;
struct GatedRequest;
namespace internal {
class GatedServer;  // httplib::Server wired to the gate (http_server.cc)
}  // namespace internal

struct HttpRequest {
  std::string method;  // "GET", "POST"
  std::string path;    // without the query string
  std::string body;
  std::vector<std::string> path_params;  // the route's capture groups, in order
  std::map<std::string, std::string> query;  // first value of each parameter
  // The parameters given more than once ("?pageSize=1&pageSize=2"), each
  // named once, for handlers that refuse the ambiguity.
  std::vector<std::string> repeated_query;
};

class HttpServer {
 public:
  struct Options {
    // Empty: no authentication.
    std::string bearer_token;
    // Paths served without a token (exact match), for probes and scrapers.
    std::set<std::string> public_paths = {"/healthz", "/readyz", "/metrics"};

    // Bounds on what clients can hold (docs/api.md, "HTTP limits"). Worst
    // case memory is about (max_connections + 8 probes-only places) *
    // (max_header_bytes + max_body_bytes), and only for clients that really
    // send that much.
    //
    // Connections being read, handled or answered; a new one beyond this is
    // answered 503 UNAVAILABLE at once.
    size_t max_connections = 128;
    // Request line and headers; beyond: 431 RESOURCE_EXHAUSTED. The request
    // line alone is bounded at 1 KiB (HttpRequestLimits::
    // max_request_line_bytes, which keeps std::regex routing's stack small);
    // beyond: 414 RESOURCE_EXHAUSTED.
    size_t max_header_bytes = 16 * 1024;
    // A request body (its Content-Length); beyond: 413 RESOURCE_EXHAUSTED,
    // decided from the headers, so the body is never buffered.
    size_t max_body_bytes = 1024 * 1024;
    // From accepting a connection to the last byte of its request, however
    // the bytes trickle in; then 408 DEADLINE_EXCEEDED and closed.
    absl::Duration request_timeout = absl::Seconds(10);
    // The longest a response may take to move kMinResponseProgressBytes
    // (http_gate.h) or to end; each time it has, the wait starts again.
    // Then closed.
    absl::Duration response_timeout = absl::Seconds(10);
    // Bytes of answers not yet written, over all connections. Past it, the
    // oldest connection with part of its answer unwritten is cut off
    // (as at max_connections), so clients that ask for large answers (a
    // plan's drawings: megabytes) and never read them hold no more memory
    // than this. One answer larger than this is still sent whole.
    size_t max_unsent_response_bytes = 256 << 20;
    // Threads that run handlers. Requires: >= 1.
    int handler_threads = 4;
    // Health probes (exact paths, GET or HEAD): run on a thread of their
    // own, so they never wait behind slow handlers, and admitted on up to
    // 8 connections past max_connections when every place is taken by a
    // request being handled (common/http_gate.h). Their handlers must be
    // quick and must not block.
    std::set<std::string> probe_paths = {"/healthz", "/readyz"};

    // Observer, for request metrics: called once per answered request, after
    // its response is complete and before it is written, with
    //   method:  the request's method if it is a standard one ("GET",
    //            "POST", "PUT", ...), else "OTHER" (also when no request
    //            line arrived);
    //   route:   the registered pattern the path matches (for a 401 too),
    //            kUnmatchedRoute when none does (404), or kRejectedRoute
    //            when the gate or httplib's parser answered before the
    //            request was routed (400 malformed, 408, 411, 413, 414 a
    //            request line over 1 KiB, 415, 416 a malformed Range, 431,
    //            503);
    //   status:  the HTTP status sent;
    //   seconds: handled requests: from the request being complete (read
    //            whole by the gate) to its response being ready, its wait
    //            for a handler thread included; gate answers: from
    //            accepting the connection. On the monotonic clock (a step
    //            of the wall clock changes no duration).
    // Every label is drawn from a bounded set: clients cannot create new
    // ones. Runs on a handler thread, or on the gate's thread for gate
    // answers: it must be thread-safe, quick and must not block.
    // Connections closed without an answer are not reported.
    std::function<void(const std::string& method, const std::string& route, int status,
                       double seconds)>
        on_response;
  };
  // The route label of requests that match no registered pattern.
  static constexpr char kUnmatchedRoute[] = "unmatched";
  // The route label of requests the gate answered itself.
  static constexpr char kRejectedRoute[] = "rejected";
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
  // Errors: INVALID_ARGUMENT for a port outside [0, 65535] (the library
  // would bind its low 16 bits); UNAVAILABLE when the address cannot be
  // bound (in use, not a local address); the message names host:port.
  // UNAVAILABLE too when the
  // connection gate cannot start (out of file descriptors).
  // Should the server stop accepting before Stop (httplib gives up on an
  // accept() error other than EMFILE and closes the socket), it logs an
  // ERROR naming host:port.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Stops accepting, waits for the handlers already running, closes every
  // connection (slow clients do not delay it) and joins the threads.
  // Without a `grace`, queued requests are dropped and an answer not yet
  // written when the gate stops is cut off. With one, first the requests already taken
  // (queued or running) are answered and their answers written (and left
  // for their clients to read: the gate's linger), for up to `grace` in
  // all, while further requests on connections already open are answered
  // 503 ("shutting down"): a submit that did its work says so. New
  // connections are refused from the start (the listening socket closes
  // first), so a client sees "connection refused". Idempotent; safe to call
  // when never started. A stopped server cannot be started again. Not to be
  // called from a handler (it would wait for itself), nor concurrently
  // with itself.
  void Stop(absl::Duration grace = absl::ZeroDuration());

  // The bound port after a successful Start, else 0.
  int port() const { return port_; }

  // The bytes this server would write to a connection that sent exactly
  // `received` and then waited, without sockets or threads, for fuzzing
  // (fuzz/rest_fuzzer.cc) and tests: the framing's rejection answer
  // (common/http_framing.h), or a complete request's answer from the
  // routes as a handler thread gives it (on_response is called as for a
  // served request), or "" for a request not complete yet (a connection
  // would be answered 408 at its timeout). Bytes past a complete request
  // are ignored, as a connection's are. Callable before Start and while
  // serving, from any thread; not after Stop.
  std::string AnswerRequestBytes(absl::string_view received);

  // The registered routes, (method, pattern) in registration order: for
  // metrics that create a series per route up front. Thread-safe once
  // started (routes are fixed from then on).
  std::vector<std::pair<std::string, std::string>> Routes() const;

 private:
  struct RouteEntry;
  void Route(const std::string& method, const std::string& pattern, Handler handler);
  void InstallHooks();
  void Dispatch(GatedRequest request);  // on the gate's thread: queue for a handler
  // Handles `request` on a handler thread; reports it to on_response,
  // timed from request.complete.
  std::string Answer(const GatedRequest& request);
  // The first registered pattern for `method` matching `path`, else the
  // first for another method (a 405), else kUnmatchedRoute.
  std::string RouteOf(const std::string& method, const std::string& path) const;
  // The methods registered for `path`, for an Allow header ("GET, HEAD,
  // POST"); empty when no route matches it.
  std::string AllowedMethods(const std::string& path) const;

  const Options options_;
  std::unique_ptr<internal::GatedServer> server_;
  std::vector<RouteEntry> routes_;             // in registration order; fixed from Start
  std::unique_ptr<FixedThreadPool> handlers_;  // from Start
  std::unique_ptr<FixedThreadPool> probes_;    // from Start: one thread
  bool IsProbe(absl::string_view request) const;
  std::unique_ptr<HttpGate> gate_;             // from Start
  std::thread thread_;                         // httplib's accept loop
  std::atomic<bool> listen_returned_{false};
  std::atomic<bool> stopping_{false};  // Stop has begun: the accept loop's end is expected
  // Set by Start when there is no bearer token: requests must then address
  // this machine by an address or one of its own names (see above).
  std::atomic<bool> own_names_only_{false};
  // gethostname()'s answer (at construction), which on Debian resolves to
  // 127.0.1.1; empty when it failed.
  const std::string machine_name_;
  // The host Start bound, as the operator spelled it (set before serving).
  std::string bound_host_;
  // Whether a request with this Host header may reach the routes.
  bool HostAllowed(const std::string& host_header) const;
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
