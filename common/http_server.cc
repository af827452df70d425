#include "common/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <regex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/echo_input.h"
#include "common/fixed_thread_pool.h"
#include "common/host_port.h"
#include "common/http_framing.h"
#include "common/http_gate.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"

namespace pipetrain {
namespace {

HttpRequest Translate(const httplib::Request& in) {
  HttpRequest out;
  out.method = in.method;
  out.path = in.path;
  out.body = in.body;
  for (size_t i = 1; i < in.matches.size(); ++i) out.path_params.push_back(in.matches[i].str());
  for (const auto& [key, value] : in.params) {
    const bool first = out.query.emplace(key, value).second;  // keeps the first
    if (!first && (out.repeated_query.empty() || out.repeated_query.back() != key)) {
      out.repeated_query.push_back(key);  // params is sorted: repeats are adjacent
    }
  }
  return out;
}

void Apply(const HttpResponse& in, httplib::Response& out) {
  out.status = in.status;
  out.set_content(in.body, in.content_type.c_str());
  // Ranges are not served (a Range header is ignored); httplib would
  // advertise "bytes" on a HEAD otherwise.
  out.set_header("Accept-Ranges", "none");
}

// Whether a request's Origin ("scheme://host[:port]") names the server it
// was sent to (its Host header, "host[:port]"), as a page served from here
// would: http or https, compared without case. "null" (an opaque origin)
// and anything else are not.
bool IsSameOrigin(absl::string_view origin, absl::string_view host) {
  if (host.empty()) return false;
  for (absl::string_view scheme : {"http://", "https://"}) {
    if (absl::StartsWithIgnoreCase(origin, scheme) &&
        absl::EqualsIgnoreCase(origin.substr(scheme.size()), host)) {
      return true;
    }
  }
  return false;
}

// The standard methods (RFC 9110 and PATCH); anything else is reported as
// "OTHER", so a client cannot mint metric labels.
std::string BoundedMethod(absl::string_view method) {
  static constexpr std::array<absl::string_view, 9> kKnown = {
      "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"};
  for (absl::string_view known : kKnown) {
    if (method == known) return std::string(known);
  }
  return "OTHER";
}

// The method and path (without the query) of a request line "GET /p?q HTTP/1.1";
// empty when the bytes do not start with one.
std::pair<std::string, std::string> MethodAndPath(absl::string_view request) {
  const size_t line_end = request.find("\r\n");
  const absl::string_view line = request.substr(0, line_end);
  const size_t space = line.find(' ');
  if (space == absl::string_view::npos) return {"", ""};
  absl::string_view target = line.substr(space + 1);
  target = target.substr(0, target.find(' '));
  return {std::string(line.substr(0, space)), std::string(target.substr(0, target.find('?')))};
}

// The pattern of the route whose handler is running on this thread, set by
// the route's adapter for HttpServer::Answer (which runs the handler
// synchronously on the same thread).
thread_local const std::string* t_matched_route = nullptr;

// Runs each task at once on httplib's accept thread. The only task is
// handing a socket to the gate, which never blocks, so no pool is needed.
class InlineTaskQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// A request the gate has already read whole, and a response collected whole
// for the gate to write: httplib's parser and routing run on it without
// touching the socket. Reads return 0 (end of stream) after the request, so
// a POST without Content-Length gets an empty body at once.
class BufferedStream : public httplib::Stream {
 public:
  explicit BufferedStream(const GatedRequest& request) : request_(request) {}

  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.bytes.size() - read_);
    std::memcpy(ptr, request_.bytes.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }
  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override {
    response_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = request_.remote_ip;
    port = request_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = request_.local_ip;
    port = request_.local_port;
  }
  socket_t socket() const override { return INVALID_SOCKET; }

  std::string TakeResponse() { return std::move(response_); }

 private:
  const GatedRequest& request_;
  size_t read_ = 0;
  std::string response_;
};

}  // namespace

namespace internal {

// httplib::Server whose accepted sockets go to an HttpGate instead of a
// thread each (httplib's own would block a pool thread per connection, with
// a timeout per read rather than per request), and which parses, routes and
// answers the requests the gate has buffered.
class GatedServer : public httplib::Server {
 public:
  GatedServer() {
    new_task_queue = [] { return new InlineTaskQueue; };
  }

  // Requires: set before listen_after_bind; the gate outlives the accept loop.
  void set_gate(HttpGate* gate) { gate_ = gate; }

  // httplib listens with a backlog of 5: a burst of probes and scrapes
  // beyond that would wait for SYN retransmits. Calling listen() again on a
  // listening socket only changes the backlog. Requires: bound.
  void WidenBacklog() { ::listen(svr_sock_, SOMAXCONN); }

  // Runs `request` through httplib's parser, routing and handlers; returns
  // the response as bytes ("Connection: close"). Thread-safe once serving
  // (routes are read only).
  std::string Handle(const GatedRequest& request) {
    BufferedStream stream(request);
    bool connection_closed = false;
    process_request(stream, /*close_connection=*/true, connection_closed,
                    [](httplib::Request& req) {
                      // The gate has answered "100 Continue" already and read the body.
                      req.headers.erase("Expect");
                      // The framing refuses compressed bodies (httplib would
                      // inflate them past max_body_bytes); should one slip past
                      // it, the handler gets the bytes as sent, not inflated.
                      req.headers.erase("Content-Encoding");
                      // The API serves no partial content. httplib would
                      // answer every range of "Range: bytes=0-,0-,..." with
                      // a whole copy of the body (an 8 KB request, a 277 MB
                      // /metrics answer): forget the ranges, answer in full.
                      req.ranges.clear();
                      // Handlers take the body as sent. httplib would parse a
                      // multipart/form-data body with std::regex (a long part
                      // header overflows a 2 MiB thread stack) and hand the
                      // handler none, and merge a form's fields into the query.
                      req.headers.erase("Content-Type");
                      // Answers go uncompressed. httplib would compress any
                      // text, JSON or SVG answer for "Accept-Encoding: br" at
                      // Brotli's slowest setting (seconds of CPU for a large
                      // plan's timeline, a fraction for every /metrics scrape,
                      // which needs no token), holding one of the few handler
                      // threads meanwhile.
                      req.headers.erase("Accept-Encoding");
                    });
    return stream.TakeResponse();
  }

 private:
  // On httplib's accept thread, for every accepted connection.
  bool process_and_close_socket(socket_t sock) override {
    gate_->Admit(sock);
    return true;
  }

  HttpGate* gate_ = nullptr;
};

}  // namespace internal

struct HttpServer::RouteEntry {
  std::string method;
  std::string pattern;
  std::regex regex;
};

HttpServer::HttpServer() : HttpServer(Options{}) {}

namespace {

std::string MachineName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

HttpServer::HttpServer(Options options)
    : options_(std::move(options)),
      server_(std::make_unique<internal::GatedServer>()),
      machine_name_(MachineName()) {
  InstallHooks();
}

bool HttpServer::HostAllowed(const std::string& host_header) const {
  if (!own_names_only_ || host_header.empty()) return true;  // HTTP/1.0 sends none
  absl::string_view host = HostOfHostHeader(host_header);
  if (IsIpLiteral(host) || IsLoopbackHost(host) || absl::EqualsIgnoreCase(host, bound_host_)) {
    return true;
  }
  if (absl::EndsWith(host, ".")) host.remove_suffix(1);
  return !machine_name_.empty() && absl::EqualsIgnoreCase(host, machine_name_);
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::InstallHooks() {
  // The gate enforces the limit before a body is read; this is a second
  // guard at the parser.
  server_->set_payload_max_length(options_.max_body_bytes);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the
  // same port and silently share its traffic. SO_REUSEADDR alone still allows
  // a quick restart over connections in TIME_WAIT.
  server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.public_paths.count(req.path) > 0) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    // A browser names the page that made a request in Origin. No page is
    // served here, so one from elsewhere is a web page acting on the API
    // with the browser's reach: without a token (--insecure, on loopback)
    // any site the user visits could submit, cancel and drain by a simple
    // POST, which browsers send without asking first.
    if (const std::string origin = req.get_header_value("Origin");
        !origin.empty() && !IsSameOrigin(origin, req.get_header_value("Host"))) {
      Apply(JsonError(403, "PERMISSION_DENIED",
                      absl::StrCat("cross-origin request refused (Origin ", EchoInput(origin),
                                   "); call the API from a client, not from a web page")),
            res);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (const std::string host = req.get_header_value("Host"); !HostAllowed(host)) {
      Apply(JsonError(403, "PERMISSION_DENIED",
                      absl::StrCat("request for host ", EchoInput(host),
                                   " refused: this server has no token, so it answers only "
                                   "requests addressed to an IP address, localhost or this "
                                   "machine's name (a web page whose name resolves to this "
                                   "server must not reach it); give it a token to be reached "
                                   "by other names")),
            res);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.bearer_token.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string header = req.get_header_value("Authorization");
    if (ConstantTimeEquals(BearerToken(header), options_.bearer_token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    // Tell apart a missing header, another scheme (Basic credentials are
    // not a wrong token) and a wrong token.
    const char* why =
        header.empty() ? "missing header \"Authorization: Bearer <token>\""
        : !absl::StartsWithIgnoreCase(header, "Bearer ")
            ? "the Authorization header must use the Bearer scheme: \"Authorization: Bearer "
              "<token>\", with the coordinator's user token (its --user-token or "
              "--user-token-file)"
            : "wrong bearer token; use the coordinator's user token (its --user-token or "
              "--user-token-file)";
    Apply(JsonError(401, "UNAUTHENTICATED", why), res);
    res.set_header("WWW-Authenticate", "Bearer");
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib calls this for every status >= 400; only fill in bodies that no
  // handler wrote (unrouted paths, wrong methods, malformed requests).
  const httplib::Server::HandlerWithResponse on_error = [this](const httplib::Request& req,
                                                               httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    // httplib parses TRACE and CONNECT but routes neither, and answers 400
    // as if the request were malformed: on a served path they are a
    // method it does not take, as PUT is.
    const bool unrouted_method =
        res.status == 400 && (req.method == "TRACE" || req.method == "CONNECT");
    const std::string allowed =
        res.status == 404 || unrouted_method ? AllowedMethods(req.path) : "";
    if (!allowed.empty()) {
      res.status = 405;
      Apply(JsonError(405, "UNIMPLEMENTED",
                      absl::StrCat("method ", req.method, " is not allowed on ", req.path,
                                   "; allowed: ", allowed, " (see docs/api.md)")),
            res);
      res.set_header("Allow", allowed);
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool unrouted = res.status == 404;
    std::string message =
        unrouted ? absl::StrCat("no endpoint ", req.method, " ", req.path, "; see docs/api.md")
        : res.status == 416
            ? "malformed Range header; the server ignores Range (it sends whole bodies): send none"
            : absl::StrCat("malformed HTTP request (status ", res.status, ")");
    Apply(JsonError(res.status, unrouted ? "NOT_FOUND" : "INVALID_ARGUMENT", message), res);
    return httplib::Server::HandlerResponse::Handled;
  };
  server_->set_error_handler(on_error);
  // A handler that throws (std::bad_alloc copying a large plan, say): 500
  // INTERNAL, the reason in this server's log only. Without this, httplib
  // would answer 500 with the exception's text in an "EXCEPTION_WHAT"
  // header, which the error handler then called a malformed request.
  server_->set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                                    std::exception_ptr thrown) {
    std::string what = "an exception that is not a std::exception";
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    PT_LOG(ERROR) << "HTTP handler for " << BoundedMethod(req.method) << " "
                  << EchoInput(req.path, 256) << " threw: " << EchoInput(what, 1024);
    res.headers.clear();
    Apply(JsonError(500, "INTERNAL", "the server failed to answer this request; its log says why"),
          res);
  });
}

void HttpServer::Get(const std::string& pattern, Handler handler) {
  Route("GET", pattern, std::move(handler));
}

void HttpServer::Post(const std::string& pattern, Handler handler) {
  Route("POST", pattern, std::move(handler));
}

void HttpServer::Route(const std::string& method, const std::string& pattern, Handler handler) {
  PT_CHECK(!started_) << "route " << method << " " << pattern << " registered after Start";
  routes_.push_back({method, pattern, std::regex(pattern)});
  auto adapter = [handler = std::move(handler),
                  route = std::make_shared<const std::string>(pattern)](const httplib::Request& req,
                                                                        httplib::Response& res) {
    t_matched_route = route.get();
    Apply(handler(Translate(req)), res);
  };
  if (method == "GET") {
    server_->Get(pattern, std::move(adapter));
  } else {
    server_->Post(pattern, std::move(adapter));
  }
}

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  PT_CHECK(!started_) << "HttpServer::Start called twice";
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP port ", port, " of ", host, " is outside [0, 65535]"));
  }
  const int bound = port == 0 ? server_->bind_to_any_port(host)
                              : (server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind HTTP address ", host, ":", port,
                                               "; is the port in use or the host not local?"));
  }
  server_->WidenBacklog();
  bound_host_ = host;
  own_names_only_ = options_.bearer_token.empty();
  handlers_ = std::make_unique<FixedThreadPool>(options_.handler_threads);
  probes_ = std::make_unique<FixedThreadPool>(1);
  HttpGate::Options gate;
  if (!options_.probe_paths.empty()) {
    gate.is_probe = [this](absl::string_view request) { return IsProbe(request); };
  }
  gate.limits = {options_.max_header_bytes, options_.max_body_bytes};
  gate.max_connections = options_.max_connections;
  gate.request_timeout = options_.request_timeout;
  gate.response_timeout = options_.response_timeout;
  gate.max_unsent_response_bytes = options_.max_unsent_response_bytes;
  if (options_.on_response) {
    gate.on_reject = [this](absl::string_view received, int status, absl::Duration elapsed) {
      options_.on_response(BoundedMethod(MethodAndPath(received).first), kRejectedRoute, status,
                           absl::ToDoubleSeconds(elapsed));
    };
  }
  absl::StatusOr<std::unique_ptr<HttpGate>> started =
      HttpGate::Start(gate, [this](GatedRequest request) { Dispatch(std::move(request)); });
  if (!started.ok()) return started.status();
  gate_ = std::move(*started);
  server_->set_gate(gate_.get());
  started_ = true;
  port_ = bound;
  thread_ = std::thread([this, host] {
    const bool clean = server_->listen_after_bind();
    // Only Stop should end the accept loop. httplib also ends it, closing
    // the socket, when accept() fails with anything but EMFILE; from then
    // on nothing here answers (/healthz, /metrics, REST), so say so loudly.
    if (!stopping_) {
      const int error = errno;  // accept()'s, when it failed
      PT_LOG(ERROR) << "HTTP server on " << host << ":" << port_ << " stopped accepting connections"
                    << (clean ? "" : absl::StrCat(" (accept failed: ", std::strerror(error), ")"))
                    << "; its endpoints no longer answer; restart the process";
    }
    listen_returned_ = true;
  });
  // httplib's stop() is a no-op until its accept loop runs, so a Stop right
  // after Start would hang; wait (briefly: the thread only has to start)
  // until the loop is up.
  while (!server_->is_running() && !listen_returned_) std::this_thread::yield();
  return port_;
}

bool HttpServer::IsProbe(absl::string_view request) const {
  const auto [method, path] = MethodAndPath(request);
  return (method == "GET" || method == "HEAD") && options_.probe_paths.count(path) > 0;
}

void HttpServer::Dispatch(GatedRequest request) {
  // std::function needs a copyable task; the request is moved in, not copied.
  auto shared = std::make_shared<GatedRequest>(std::move(request));
  FixedThreadPool& pool = IsProbe(shared->bytes) ? *probes_ : *handlers_;
  pool.Post([this, shared] { gate_->Respond(shared->connection, Answer(*shared)); });
}

std::string HttpServer::Answer(const GatedRequest& request) {
  t_matched_route = nullptr;
  std::string response = server_->Handle(request);
  const std::string* matched = t_matched_route;
  t_matched_route = nullptr;
  if (!options_.on_response || response.empty()) return response;
  const auto [method, path] = MethodAndPath(request.bytes);
  const int status = HttpStatusOf(response);
  std::string route;
  if (matched != nullptr) {
    route = *matched;
  } else if (status == 400 || status == 414 || status == 416) {
    // httplib's parser refused it before routing (malformed, a request
    // line over its 8 KiB, a bad Range): rejected, not matched against the
    // routes. (The framing's request line limit, 1 KiB by default, is what
    // keeps the paths std::regex does match short.)
    route = kRejectedRoute;
  } else {
    route = RouteOf(method, path);  // refused before its handler (401), or unrouted
  }
  // From the request being complete (its wait in the handler queue
  // included), on the monotonic clock: a step of the wall clock is no
  // request's duration.
  options_.on_response(BoundedMethod(method), route, status,
                       absl::ToDoubleSeconds(MonotonicClock()->Now() - request.complete));
  return response;
}

std::string HttpServer::AnswerRequestBytes(absl::string_view received) {
  HttpRequestFramer framer({options_.max_header_bytes, options_.max_body_bytes});
  switch (framer.Update(received)) {
    case HttpRequestFramer::Progress::kNeedMore:
      return "";
    case HttpRequestFramer::Progress::kRejected: {
      const HttpRejection& why = framer.rejection();
      if (options_.on_response) {  // as the gate's on_reject reports it
        options_.on_response(BoundedMethod(MethodAndPath(received).first), kRejectedRoute,
                             why.status, 0);
      }
      return SerializeClosingResponse(JsonError(why.status, why.code, why.message));
    }
    case HttpRequestFramer::Progress::kComplete:
      break;
  }
  GatedRequest request;
  request.bytes = std::string(received.substr(0, framer.request_bytes()));
  request.remote_ip = request.local_ip = "127.0.0.1";
  request.complete = MonotonicClock()->Now();
  return Answer(request);
}

std::vector<std::pair<std::string, std::string>> HttpServer::Routes() const {
  std::vector<std::pair<std::string, std::string>> routes;
  for (const RouteEntry& entry : routes_) routes.emplace_back(entry.method, entry.pattern);
  return routes;
}

std::string HttpServer::RouteOf(const std::string& method, const std::string& path) const {
  for (const RouteEntry& entry : routes_) {
    if (entry.method == method && std::regex_match(path, entry.regex)) return entry.pattern;
  }
  for (const RouteEntry& entry : routes_) {  // a wrong method on a known path (405)
    if (std::regex_match(path, entry.regex)) return entry.pattern;
  }
  return kUnmatchedRoute;
}

std::string HttpServer::AllowedMethods(const std::string& path) const {
  std::set<std::string> methods;
  for (const RouteEntry& entry : routes_) {
    if (!std::regex_match(path, entry.regex)) continue;
    methods.insert(entry.method);
    if (entry.method == "GET") methods.insert("HEAD");  // httplib answers HEAD with GET's route
  }
  return absl::StrJoin(methods, ", ");
}

void HttpServer::Stop(absl::Duration grace) {
  if (!thread_.joinable()) return;
  stopping_ = true;  // before the accept loop can end: no error logged for it
  server_->stop();
  thread_.join();    // no more Admit
  if (grace > absl::ZeroDuration()) {
    // Requests taken are answered (a submit that did its work must say
    // so), new ones turned away, within the grace.
    const absl::Time deadline = MonotonicClock()->Now() + grace;
    gate_->Finish(deadline);
    handlers_->AwaitIdle(deadline - MonotonicClock()->Now());
    probes_->AwaitIdle(deadline - MonotonicClock()->Now());
  }
  handlers_->Stop();  // drops queued requests, waits for running handlers
  probes_->Stop();
  gate_->Stop();  // writes what was answered (within the grace), closes every connection
}

void ServePrometheus(HttpServer& server, const prometheus::Collectable* collectable,
                     std::function<void()> before_collect) {
  server.Get("/metrics", [collectable, before_collect = std::move(before_collect)](
                             const HttpRequest&) {
    if (before_collect) before_collect();
    HttpResponse response;
    response.body = prometheus::TextSerializer().Serialize(collectable->Collect());
    response.content_type = "text/plain; version=0.0.4";
    return response;
  });
}

}  // namespace pipetrain
