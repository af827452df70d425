#include "common/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"

namespace pipetrain {
namespace {

constexpr char kBearerPrefix[] = "Bearer ";

// Compares in time independent of where the strings first differ, so a
// client cannot find the token byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

HttpRequest Translate(const httplib::Request& in) {
  HttpRequest out;
  out.method = in.method;
  out.path = in.path;
  out.body = in.body;
  for (size_t i = 1; i < in.matches.size(); ++i) out.path_params.push_back(in.matches[i].str());
  for (const auto& [key, value] : in.params) out.query.emplace(key, value);  // keeps the first
  return out;
}

void Apply(const HttpResponse& in, httplib::Response& out) {
  out.status = in.status;
  out.set_content(in.body, in.content_type.c_str());
}

}  // namespace

HttpResponse JsonResponse(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

HttpResponse JsonError(int status, absl::string_view code, absl::string_view message) {
  nlohmann::json body = {{"code", std::string(code)}, {"message", std::string(message)}};
  // replace: invalid UTF-8 in a message (e.g. echoed input) must not throw.
  return JsonResponse(status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

HttpServer::HttpServer() : HttpServer(Options{}) {}

HttpServer::HttpServer(Options options)
    : options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {
  InstallHooks();
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::InstallHooks() {
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the
  // same port and silently share its traffic. SO_REUSEADDR alone still allows
  // a quick restart over connections in TIME_WAIT.
  server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.bearer_token.empty() || options_.public_paths.count(req.path) > 0) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string header = req.get_header_value("Authorization");
    if (absl::StartsWith(header, kBearerPrefix) &&
        ConstantTimeEquals(absl::string_view(header).substr(sizeof(kBearerPrefix) - 1),
                           options_.bearer_token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    Apply(JsonError(401, "UNAUTHENTICATED",
                    header.empty() ? "missing header \"Authorization: Bearer <token>\""
                                   : "wrong bearer token; check the coordinator's --rest-token"),
          res);
    res.set_header("WWW-Authenticate", "Bearer");
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib calls this for every status >= 400; only fill in bodies that no
  // handler wrote (unrouted paths, malformed requests).
  const httplib::Server::HandlerWithResponse on_error = [](const httplib::Request& req,
                                                          httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const bool unrouted = res.status == 404;
    Apply(JsonError(res.status, unrouted ? "NOT_FOUND" : "INVALID_ARGUMENT",
                    unrouted ? absl::StrCat("no endpoint ", req.method, " ", req.path,
                                            "; see docs/api.md")
                             : absl::StrCat("malformed HTTP request (status ", res.status, ")")),
          res);
    return httplib::Server::HandlerResponse::Handled;
  };
  server_->set_error_handler(on_error);
}

void HttpServer::Get(const std::string& pattern, Handler handler) {
  Route("GET", pattern, std::move(handler));
}

void HttpServer::Post(const std::string& pattern, Handler handler) {
  Route("POST", pattern, std::move(handler));
}

void HttpServer::Route(const std::string& method, const std::string& pattern, Handler handler) {
  PT_CHECK(!started_) << "route " << method << " " << pattern << " registered after Start";
  auto adapter = [handler = std::move(handler)](const httplib::Request& req,
                                                httplib::Response& res) {
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
  const int bound = port == 0 ? server_->bind_to_any_port(host)
                              : (server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind HTTP address ", host, ":", port,
                                               "; is the port in use or the host not local?"));
  }
  started_ = true;
  port_ = bound;
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
  // httplib's stop() is a no-op until its accept loop runs, so a Stop right
  // after Start would hang; wait (briefly: the thread only has to start)
  // until the loop is up.
  while (!server_->is_running() && !listen_returned_) std::this_thread::yield();
  return port_;
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
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
