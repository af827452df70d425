#include "common/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/host_port.h"
#include "common/slow_http_clients.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace pipetrain {
namespace {

// A client whose every call has a deadline, so a broken server fails the
// test instead of hanging it.
std::unique_ptr<httplib::Client> ClientFor(int port) {
  auto client = std::make_unique<httplib::Client>("127.0.0.1", port);
  client->set_connection_timeout(10);
  client->set_read_timeout(10);
  client->set_write_timeout(10);
  return client;
}

// A client that gives the server one second for everything: a server whose
// threads are all held by slow clients fails the test instead of slowing it.
std::unique_ptr<httplib::Client> ImpatientClientFor(int port) {
  auto client = std::make_unique<httplib::Client>("127.0.0.1", port);
  client->set_connection_timeout(1);
  client->set_read_timeout(1);
  client->set_write_timeout(1);
  return client;
}

// A raw connection, for requests httplib's client does not send (no
// Content-Length, Expect, chunked, a head cut short). Every read waits at
// most `timeout`.
class RawConnection {
 public:
  RawConnection(int port, absl::Duration timeout) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    const timeval tv = absl::ToTimeval(timeout);
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawConnection() { close(fd_); }

  bool connected() const { return connected_; }
  // Waits (at most 30 s) until the server has sent something, reading none
  // of it.
  bool AwaitReadable() {
    pollfd readable{fd_, POLLIN, 0};
    return poll(&readable, 1, 30000) == 1;
  }
  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Reads until the server closes, the read times out, or (if not empty)
  // `marker` has arrived; returns everything read so far.
  std::string Read(absl::string_view marker = "") {
    char buffer[4096];
    while (marker.empty() || !absl::StrContains(received_, marker)) {
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      received_.append(buffer, n);
    }
    return received_;
  }

 private:
  const int fd_;
  bool connected_ = false;
  std::string received_;
};

// The body after the last head in `response` (after any "100 Continue").
std::string BodyOf(absl::string_view response) {
  const size_t end = response.rfind("\r\n\r\n");
  return end == absl::string_view::npos ? "" : std::string(response.substr(end + 4));
}

HttpResponse Echo(const HttpRequest& request) {
  nlohmann::json body = {{"method", request.method},
                         {"path", request.path},
                         {"params", request.path_params},
                         {"body", request.body}};
  return JsonResponse(200, body.dump());
}

// The JSON error body every refused request gets (google.rpc.Status):
// its code, message and empty details.
nlohmann::json ErrorBody(int code, const std::string& message) {
  return nlohmann::json(
      {{"code", code}, {"message", message}, {"details", nlohmann::json::array()}});
}

TEST(HttpServer, Start_PortZero_BindsAFreePortAndRoutesWithCaptures) {
  HttpServer server;
  server.Get(R"(/things/([^/]+)/parts/([^/]+))", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_EQ(server.port(), *port);

  httplib::Result result = ClientFor(*port)->Get("/things/a1/parts/b2");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
  nlohmann::json body = nlohmann::json::parse(result->body);
  EXPECT_EQ(body["method"], "GET");
  EXPECT_EQ(body["path"], "/things/a1/parts/b2");
  EXPECT_EQ(body["params"], nlohmann::json::array({"a1", "b2"}));
}

TEST(HttpServer, Post_Body_ReachesHandler) {
  HttpServer server;
  server.Post("/echo", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Post("/echo", "{\"x\": 1}", "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(nlohmann::json::parse(result->body)["body"], "{\"x\": 1}");
}

TEST(HttpServer, Get_UnroutedPath_Returns404WithJsonError) {
  HttpServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Get("/nowhere");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  nlohmann::json body = nlohmann::json::parse(result->body);
  EXPECT_EQ(body["code"], 5);
  EXPECT_TRUE(absl::StrContains(body["message"].get<std::string>(), "GET /nowhere"));
}

TEST(HttpServer, HandlerError_KeepsHandlerBody) {
  HttpServer server;
  server.Get("/bad",
             [](const HttpRequest&) { return JsonError(400, "INVALID_ARGUMENT", "x: bad"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Get("/bad");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(nlohmann::json::parse(result->body),
            nlohmann::json::parse(R"({"code": 3, "message": "x: bad", "details": [
                {"@type": "type.googleapis.com/google.rpc.BadRequest",
                 "fieldViolations": [{"field": "x", "description": "bad"}]}]})"));
}

class HttpServerAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<HttpServer>(HttpServer::Options{.bearer_token = "s3cret"});
    server_->Get("/private", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
    server_->Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
    absl::StatusOr<int> port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    client_ = ClientFor(*port);
  }

  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerAuthTest, NoToken_Returns401NamingTheHeader) {
  httplib::Result result = client_->Get("/private");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 401);
  EXPECT_EQ(result->get_header_value("WWW-Authenticate"), "Bearer");
  nlohmann::json body = nlohmann::json::parse(result->body);
  EXPECT_EQ(body["code"], 16);
  EXPECT_TRUE(absl::StrContains(body["message"].get<std::string>(), "Authorization: Bearer"));
}

TEST_F(HttpServerAuthTest, WrongToken_Returns401) {
  httplib::Result result = client_->Get("/private", {{"Authorization", "Bearer s3cre7"}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 401);
  EXPECT_TRUE(absl::StrContains(result->body, "wrong bearer token"));
}

TEST_F(HttpServerAuthTest, OtherScheme_Returns401NamingTheBearerScheme) {
  for (const char* value : {"Basic dXNlcjpzM2NyZXQ=", "s3cret", "Bearers3cret"}) {
    httplib::Result result = client_->Get("/private", {{"Authorization", value}});
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 401);
    EXPECT_TRUE(absl::StrContains(result->body, "must use the Bearer scheme")) << result->body;
  }
}

// RFC 9112 3.2: refused by the framing (http_framing_test), before the token.
TEST_F(HttpServerAuthTest, NoHost_Returns400) {
  const std::string response =
      server_->AnswerRequestBytes("GET /healthz HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n");
  EXPECT_EQ(HttpStatusOf(response), 400) << response;
  EXPECT_TRUE(absl::StrContains(response, "missing Host header")) << response;
}

TEST_F(HttpServerAuthTest, RightToken_Returns200) {
  httplib::Result result = client_->Get("/private", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
}

TEST_F(HttpServerAuthTest, PublicPath_NeedsNoToken) {
  httplib::Result result = client_->Get("/healthz");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
}

TEST(HttpServer, ServePrometheus_RefreshesAndServesTextFormat) {
  prometheus::Registry registry;
  prometheus::Counter& scrapes = prometheus::BuildCounter()
                                     .Name("pipetrain_test_scrapes_total")
                                     .Help("Scrapes seen by the refresh hook.")
                                     .Register(registry)
                                     .Add({});
  HttpServer server({.bearer_token = "token"});  // /metrics stays public
  ServePrometheus(server, &registry, [&scrapes] { scrapes.Increment(); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();

  httplib::Result result = ClientFor(*port)->Get("/metrics");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_TRUE(absl::StrContains(result->body, "# HELP pipetrain_test_scrapes_total "));
  EXPECT_TRUE(absl::StrContains(result->body, "# TYPE pipetrain_test_scrapes_total counter"));
  EXPECT_TRUE(absl::StrContains(result->body, "\npipetrain_test_scrapes_total 1\n"))
      << result->body;
}

TEST(HttpServer, Start_PortInUse_Unavailable) {
  HttpServer first;
  absl::StatusOr<int> port = first.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  HttpServer second;
  absl::StatusOr<int> again = second.Start("127.0.0.1", *port);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(again.status().message(), "127.0.0.1:" + std::to_string(*port)))
      << again.status();
}

// The library keeps a port's low 16 bits: 65536 + p bound port p.
TEST(HttpServer, Start_PortOutOfRange_InvalidArgumentNothingBound) {
  for (int port : {-1, 65536, 70000}) {
    HttpServer server;
    absl::StatusOr<int> bound = server.Start("127.0.0.1", port);
    EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument) << port;
  }
}

TEST(HttpServer, Stop_Twice_AndNeverStarted_AreNoOps) {
  HttpServer never_started;
  never_started.Stop();
  HttpServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  server.Stop();
  server.Stop();
}

// This process's listening socket on `port`, or -1.
int ListeningSocketOf(int port) {
  for (int fd = 0; fd < 1024; ++fd) {
    int listening = 0;
    socklen_t size = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening) continue;
    sockaddr_in address{};
    size = sizeof(address);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0 &&
        address.sin_family == AF_INET && ntohs(address.sin_port) == port) {
      return fd;
    }
  }
  return -1;
}

// Stderr (where PT_LOG writes) goes to a pipe while this lives.
class StderrPipe {
 public:
  StderrPipe() : saved_(dup(STDERR_FILENO)) {
    if (pipe(fds_) != 0) ADD_FAILURE() << "pipe: " << std::strerror(errno);
    dup2(fds_[1], STDERR_FILENO);
  }
  ~StderrPipe() {
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    close(fds_[0]);
    close(fds_[1]);
  }
  // What was written, up to `marker` or until nothing more is written for
  // `patience` (only a failing test waits that long).
  std::string ReadUntil(absl::string_view marker, absl::Duration patience) {
    pollfd readable = {fds_[0], POLLIN, 0};
    while (!absl::StrContains(read_, marker) &&
           poll(&readable, 1, absl::ToInt64Milliseconds(patience)) == 1) {
      char buffer[4096];
      const ssize_t n = read(fds_[0], buffer, sizeof(buffer));
      if (n <= 0) break;
      read_.append(buffer, n);
    }
    return read_;
  }

 private:
  const int saved_;
  int fds_[2] = {-1, -1};
  std::string read_;
};

// httplib ends its accept loop, closing the socket, when accept() fails
// with anything but EMFILE: /healthz and /metrics then stop answering,
// which must not go unsaid.
TEST(HttpServer, Serve_AcceptFails_LogsAnError) {
  HttpServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  const int listening = ListeningSocketOf(*port);
  ASSERT_GE(listening, 0);
  StderrPipe stderr_pipe;
  ASSERT_EQ(shutdown(listening, SHUT_RDWR), 0);  // accept() fails with EINVAL
  EXPECT_TRUE(absl::StrContains(
      stderr_pipe.ReadUntil("restart the process", absl::Seconds(10)),
      absl::StrCat("HTTP server on 127.0.0.1:", *port,
                   " stopped accepting connections (accept failed: Invalid argument); its "
                   "endpoints no longer answer; restart the process")));
}

TEST(HttpServer, Stop_LogsNoError) {
  StderrPipe stderr_pipe;
  HttpServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  server.Stop();  // joins the accept loop: anything it logged is in the pipe
  std::cerr << "marker" << std::endl;
  EXPECT_FALSE(
      absl::StrContains(stderr_pipe.ReadUntil("marker", absl::Seconds(10)), "stopped accepting"));
}

TEST(HttpServer, Get_SixtyFourSlowClientsConnected_HealthzStillAnswered) {
  // A long request_timeout: the slow clients must be held, not timed out.
  HttpServer server({.request_timeout = absl::Minutes(10)});
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  auto slow = SlowHttpClients::Open(*port, {.connections = 64, .trickling = 48});
  ASSERT_TRUE(slow.ok()) << slow.status();

  // More probes than handler threads: none of them may be held by a client.
  for (int i = 0; i < 8; ++i) {
    httplib::Result result = ImpatientClientFor(*port)->Get("/healthz");
    ASSERT_TRUE(result) << "probe " << i << ": " << httplib::to_string(result.error());
    EXPECT_EQ(result->status, 200);
  }
  EXPECT_EQ((*slow)->CountAnsweredOrClosed(), 0) << "slow clients must be held, not dropped";
}

TEST(HttpServer, Post_NoBodyNoContentLength_ReachesHandlerAtOnceWithEmptyBody) {
  HttpServer server;
  server.Post(R"(/v1/jobs/([^/:]+):cancel)", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  // As `curl -X POST http://HOST/v1/jobs/job-1:cancel` sends it. One second:
  // a server that waits for a body until the client closes fails here.
  RawConnection connection(*port, absl::Seconds(1));
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(connection.Send("POST /v1/jobs/job-1:cancel HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  const std::string response = connection.Read();
  ASSERT_EQ(HttpStatusOf(response), 200) << response;
  EXPECT_TRUE(absl::StrContains(response, "Connection: close")) << response;
  nlohmann::json body = nlohmann::json::parse(BodyOf(response));
  EXPECT_EQ(body["body"], "");
  EXPECT_EQ(body["params"], nlohmann::json::array({"job-1"}));
}

TEST(HttpServer, Post_BodyOverDefaultLimit_Returns413NamingTheLimit) {
  HttpServer server;
  std::atomic<int> calls{0};
  server.Post("/echo", [&calls](const HttpRequest& r) {
    ++calls;
    return Echo(r);
  });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result =
      ClientFor(*port)->Post("/echo", std::string(1024 * 1024 + 1, 'x'), "application/json");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 413);
  EXPECT_EQ(nlohmann::json::parse(result->body),
            ErrorBody(8,
                      "request body of 1048577 bytes exceeds the limit of "
                      "1048576 bytes"));
  EXPECT_EQ(calls, 0);
}

TEST(HttpServer, Post_BodyAtTheLimit_ReachesHandler) {
  HttpServer server({.max_body_bytes = 1000});
  server.Post("/echo", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Post("/echo", std::string(1000, 'x'), "text/plain");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(nlohmann::json::parse(result->body)["body"], std::string(1000, 'x'));
}

TEST(HttpServer, Get_HeadersOverLimit_Returns431) {
  HttpServer server({.max_header_bytes = 1024});
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Get("/healthz", {{"X-Big", std::string(2000, 'a')}});
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 431);
  nlohmann::json body = nlohmann::json::parse(result->body);
  EXPECT_EQ(body["code"], 8);
  EXPECT_TRUE(
      absl::StrContains(body["message"].get<std::string>(), "exceed the limit of 1024 bytes"))
      << body;
}

TEST(HttpServer, Post_ChunkedBody_Returns411) {
  HttpServer server;
  server.Post("/echo", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawConnection connection(*port, absl::Seconds(10));
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(
      connection.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: "
                      "chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"));
  const std::string response = connection.Read();
  ASSERT_EQ(HttpStatusOf(response), 411) << response;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(response))["code"], 12);
}

// httplib inflates gzip, deflate and br bodies; max_body_bytes bounds only
// the compressed bytes, so 100 KB compressed to a few hundred would reach
// the handler whole past a 1000-byte limit.
TEST(HttpServer, Post_GzipBody_Returns415AndTheHandlerSeesNoBody) {
  HttpServer server({.max_body_bytes = 1000});
  std::atomic<int> calls{0};
  server.Post("/echo", [&calls](const HttpRequest& r) {
    ++calls;
    return Echo(r);
  });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  auto client = ClientFor(*port);
  client->set_compress(true);  // "Content-Encoding: gzip"
  httplib::Result result = client->Post("/echo", std::string(100000, 'x'), "text/plain");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 415);
  EXPECT_EQ(nlohmann::json::parse(result->body),
            ErrorBody(12,
                      "request bodies with Content-Encoding \"gzip\" are not accepted; "
                      "send the body uncompressed"));
  EXPECT_EQ(calls, 0);  // so no handler saw the 100000 bytes inflated
}

// A Content-Encoding header behind a bare LF, which httplib reads as a
// header of its own, is refused with the bare LF. (Were one to slip past,
// the server erases the header before httplib reads the body, so the body
// would arrive as sent, not inflated.)
TEST(HttpServer, AnswerRequestBytes_ContentEncodingBehindABareLf_Returns400) {
  // gzip of 4096 'x' (Python's gzip.compress(b"x" * 4096, mtime=0)).
  const std::string gzip(
      "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xed\xc1\x01\x0d\x00\x00\x00\xc2\xa0"
      "\xda\x8f\x6f\x0f\x07\x14\x00\x00\x00\xf0\x6e\xc1\x77\x10\x3e\x00\x10\x00\x00",
      38);
  HttpServer server({.max_body_bytes = 1000});
  std::vector<std::string> bodies;  // AnswerRequestBytes runs the handler on this thread
  server.Post("/echo", [&](const HttpRequest& r) {
    bodies.push_back(r.body);
    return JsonResponse(200, "{}");
  });
  const std::string response =
      server.AnswerRequestBytes(absl::StrCat("POST /echo HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
                                             "a\nContent-Encoding: gzip\r\nContent-Length: ",
                                             gzip.size(), "\r\n\r\n", gzip));
  EXPECT_EQ(HttpStatusOf(response), 400) << response;
  EXPECT_EQ(bodies, std::vector<std::string>{});
}

// "Accept-Encoding: br" made httplib compress the answer at Brotli's
// slowest setting (seconds of CPU for a large SVG, and /metrics needs no
// token): answers go uncompressed, whatever the client accepts.
TEST(HttpServer, AcceptEncoding_Ignored_AnswerUncompressed) {
  HttpServer server;
  const std::string big(1 << 20, 'a');
  server.Get("/big", [&](const HttpRequest&) {
    HttpResponse response;
    response.body = big;
    response.content_type = "text/plain";
    return response;
  });
  for (const char* encoding : {"br", "gzip", "gzip, deflate, br"}) {
    SCOPED_TRACE(encoding);
    const std::string response = server.AnswerRequestBytes(absl::StrCat(
        "GET /big HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: ", encoding, "\r\n\r\n"));
    EXPECT_EQ(HttpStatusOf(response), 200);
    EXPECT_FALSE(absl::StrContains(absl::AsciiStrToLower(response), "content-encoding"))
        << response.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(response, big));
  }
}

// A web page elsewhere calling the API through the user's browser (which
// names the page in Origin) is refused before any handler, token or not:
// without a token any site could otherwise POST a job to a loopback
// coordinator. Same-origin and Origin-less requests pass; public paths too.
TEST(HttpServer, CrossOriginRequest_Refused403_SameOriginAndNoOriginPass) {
  HttpServer server;
  int calls = 0;
  server.Post("/v1/jobs", [&](const HttpRequest&) {
    ++calls;
    return JsonResponse(200, "{}");
  });
  server.Get("/metrics", [&](const HttpRequest&) { return JsonResponse(200, "{}"); });
  auto post = [&](const std::string& origin_line) {
    return server.AnswerRequestBytes(
        absl::StrCat("POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n", origin_line,
                     "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"));
  };
  for (const char* bad :
       {"Origin: http://evil.example\r\n", "Origin: null\r\n", "Origin: http://127.0.0.1:9999\r\n",
        "Origin: http://127.0.0.1:8080.evil.example\r\n"}) {
    SCOPED_TRACE(bad);
    const std::string response = post(bad);
    EXPECT_EQ(HttpStatusOf(response), 403) << response;
    EXPECT_TRUE(absl::StrContains(response, "cross-origin request refused")) << response;
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(HttpStatusOf(post("")), 200);
  EXPECT_EQ(HttpStatusOf(post("Origin: http://127.0.0.1:8080\r\n")), 200);
  EXPECT_EQ(HttpStatusOf(post("Origin: HTTPS://127.0.0.1:8080\r\n")), 200);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(HttpStatusOf(server.AnswerRequestBytes("GET /metrics HTTP/1.1\r\nHost: localhost\r\n"
                                                   "Origin: http://evil.example\r\n\r\n")),
            200);
}

// DNS rebinding: a page at evil.example whose name is made to resolve to
// the server's address sends "Host: evil.example:port" and its own origin,
// so the Origin check passes it. A tokenless server, on loopback or on
// every interface (0.0.0.0, which listens on loopback and the LAN too),
// answers only addresses, loopback names and the machine's own; public
// paths stay public.
class TokenlessHostTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenlessHostTest, ForeignHostRefused403_AddressesAndOwnNamesPass) {
  HttpServer server;
  int calls = 0;
  server.Post("/v1/jobs", [&](const HttpRequest&) {
    ++calls;
    return JsonResponse(200, "{}");
  });
  server.Get("/metrics", [&](const HttpRequest&) { return JsonResponse(200, "{}"); });
  ASSERT_TRUE(server.Start(GetParam(), 0).ok());
  auto post = [&](const std::string& host, const std::string& origin = "") {
    return server.AnswerRequestBytes(
        absl::StrCat("POST /v1/jobs HTTP/1.1\r\nHost: ", host, "\r\n",
                     origin.empty() ? "" : absl::StrCat("Origin: ", origin, "\r\n"),
                     "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"));
  };
  for (const char* bad : {"evil.example:8080", "evil.example", "localhost.evil.example:80",
                          "10.0.0.1.nip.example:8080", "[::1]evil.example"}) {
    SCOPED_TRACE(bad);
    const std::string response = post(bad, absl::StrCat("http://", bad));
    EXPECT_EQ(HttpStatusOf(response), 403) << response;
    EXPECT_TRUE(absl::StrContains(response, "this server has no token")) << response;
  }
  EXPECT_EQ(calls, 0);
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  const std::vector<std::string> good = {
      "127.0.0.1:8080", "localhost:8080", "LOCALHOST",      "[::1]:8080",
      "127.0.1.1",      "10.0.0.1:8080",  "[fe80::2]:8080", absl::StrCat(name, ":8080"),
      GetParam()};
  for (const std::string& host : good) {
    SCOPED_TRACE(host);
    EXPECT_EQ(HttpStatusOf(post(host)), 200);
  }
  EXPECT_EQ(calls, static_cast<int>(good.size()));
  EXPECT_EQ(HttpStatusOf(
                server.AnswerRequestBytes("GET /metrics HTTP/1.1\r\nHost: evil.example\r\n\r\n")),
            200);
  server.Stop();
}

INSTANTIATE_TEST_SUITE_P(LoopbackAndEveryInterface, TokenlessHostTest,
                         ::testing::Values("127.0.0.1", "0.0.0.0"));

// The host the server was started with passes as a Host in any spelling
// getaddrinfo binds (127.1 is no address to inet_pton, nor a loopback
// name); a foreign name is still refused.
TEST(HttpServer, TokenlessBoundByASpellingOfItsOwn_ThatSpellingPasses_ForeignHostRefused) {
  HttpServer server;
  server.Get("/v1/jobs", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  ASSERT_FALSE(IsLoopbackHost("127.1"));
  ASSERT_TRUE(server.Start("127.1", 0).ok());
  const auto get = [&](const std::string& host) {
    return HttpStatusOf(server.AnswerRequestBytes(
        absl::StrCat("GET /v1/jobs HTTP/1.1\r\nHost: ", host, "\r\n\r\n")));
  };
  EXPECT_EQ(get("evil.example:8080"), 403);
  EXPECT_EQ(get("127.1:8080"), 200);
  EXPECT_EQ(get("127.0.0.1"), 200);
  server.Stop();
}

// With a token the rebound page has nothing to send, so any Host is
// answered (a TLS proxy in front may pass the public name on).
TEST(HttpServer, WithTokenOnLoopback_AnyHostAnswered) {
  HttpServer server(HttpServer::Options{.bearer_token = "s3cret"});
  server.Get("/v1/jobs", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  EXPECT_EQ(
      HttpStatusOf(server.AnswerRequestBytes("GET /v1/jobs HTTP/1.1\r\nHost: api.example.com\r\n"
                                             "Authorization: Bearer s3cret\r\n\r\n")),
      200);
  EXPECT_EQ(HttpStatusOf(server.AnswerRequestBytes(
                "GET /v1/jobs HTTP/1.1\r\nHost: api.example.com\r\n\r\n")),
            401);
  server.Stop();
}

// A handler that throws gets 500 INTERNAL with the usual error body; the
// exception's text stays in the server's log, not in a response header.
TEST(HttpServer, HandlerThrows_500Internal_NothingOfTheExceptionSent) {
  HttpServer server;
  server.Get("/boom", [](const HttpRequest&) -> HttpResponse {
    throw std::runtime_error("secret detail at 0xdeadbeef");
  });
  const std::string response =
      server.AnswerRequestBytes("GET /boom HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(HttpStatusOf(response), 500) << response;
  EXPECT_TRUE(absl::StrContains(response, "\"code\":13")) << response;  // INTERNAL
  EXPECT_FALSE(absl::StrContains(response, "secret detail")) << response;
  EXPECT_FALSE(absl::StrContains(response, "EXCEPTION_WHAT")) << response;
}

// httplib would answer each range with a copy of the body, in a
// multipart/byteranges response: thousands of "0-" ranges in an 8 KB
// request made a 277 MB answer. Ranges are ignored: the whole body, once.
TEST(HttpServer, Get_ManyRanges_Returns200WithTheBodyOnce) {
  HttpServer server;
  server.Get("/thing", [](const HttpRequest&) { return JsonResponse(200, "{\"x\":1}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  std::string ranges = "bytes=0-";
  for (int i = 0; i < 80; ++i) ranges += ",0-";  // 248 bytes, within the Range limit
  for (const std::string& range : {std::string("bytes=2-4"), ranges}) {
    SCOPED_TRACE(range.substr(0, 20));
    httplib::Result result = ClientFor(*port)->Get("/thing", {{"Range", range}});
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    EXPECT_EQ(result->status, 200);
    EXPECT_EQ(result->body, "{\"x\":1}");
    EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
    EXPECT_FALSE(result->has_header("Content-Range"));
  }
}

// Handlers take the body as sent, whatever its Content-Type: httplib would
// parse multipart/form-data with std::regex (a long part header overflows
// a 2 MiB thread stack) and give the handler an empty body.
TEST(HttpServer, Post_MultipartBody_ReachesHandlerAsSent) {
  HttpServer server;
  server.Post("/echo", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string body =
      "--xx\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nv\r\n--xx--\r\n";
  httplib::Result result =
      ClientFor(*port)->Post("/echo", body, "multipart/form-data; boundary=xx");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(nlohmann::json::parse(result->body)["body"], body);
}

// Ranges are not served: a HEAD (answered through the GET route) and a GET
// both say so, where httplib would advertise "bytes" on the HEAD.
TEST(HttpServer, AnswerRequestBytes_HeadAndGet_SayAcceptRangesNone) {
  HttpServer server;
  server.Get("/thing", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  for (const std::string method : {"HEAD", "GET"}) {
    const std::string response =
        server.AnswerRequestBytes(method + " /thing HTTP/1.1\r\nHost: localhost\r\n\r\n");
    EXPECT_EQ(HttpStatusOf(response), 200) << response;
    EXPECT_TRUE(absl::StrContains(response, "Accept-Ranges: none\r\n")) << response;
    EXPECT_FALSE(absl::StrContains(response, "Accept-Ranges: bytes")) << response;
  }
}

// httplib parses Range with std::regex before the server ignores it: a
// long one is refused first (behind a bare LF, the bare LF is refused).
TEST(HttpServer, AnswerRequestBytes_RangeOverLimit_Returns431) {
  HttpServer server;
  server.Get("/thing", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  std::string ranges = "bytes=0-0";
  while (ranges.size() < 4000) ranges += ",0-0";
  const std::string response = server.AnswerRequestBytes(
      "GET /thing HTTP/1.1\r\nHost: localhost\r\nRange: " + ranges + "\r\n\r\n");
  EXPECT_EQ(HttpStatusOf(response), 431) << response;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(response))["message"],
            "Range header of 4001 bytes exceeds the limit of 256 bytes; the server ignores "
            "Range: send none");
  EXPECT_EQ(HttpStatusOf(server.AnswerRequestBytes(
                "GET /thing HTTP/1.1\r\nHost: localhost\r\nX: a\nRange: " + ranges + "\r\n\r\n")),
            400);
}

// Refusals httplib decides alone come with a message naming the cause: a
// header line over its limit (decided by the framer first) and a Range it
// cannot parse.
TEST(HttpServer, AnswerRequestBytes_LongHeaderLineOrMalformedRange_NamedInTheMessage) {
  HttpServer server;
  server.Get("/thing", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  const std::string long_line = server.AnswerRequestBytes(
      "GET /thing HTTP/1.1\r\nHost: localhost\r\nX-A: " + std::string(9000, 'a') + "\r\n\r\n");
  EXPECT_EQ(HttpStatusOf(long_line), 400) << long_line;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(long_line))["message"],
            "a header line of 9007 bytes exceeds the limit of 8192 bytes");
  const std::string range =
      server.AnswerRequestBytes("GET /thing HTTP/1.1\r\nHost: localhost\r\nRange: garbage\r\n\r\n");
  EXPECT_EQ(HttpStatusOf(range), 416) << range;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(range))["message"],
            "malformed Range header; the server ignores Range (it sends whole bodies): send none");
}

TEST(HttpServer, Read_MalformedRequestLine_Returns400WithJsonError) {
  HttpServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawConnection connection(*port, absl::Seconds(10));
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(connection.Send("NOT AN HTTP REQUEST\r\n\r\n"));
  const std::string response = connection.Read();
  ASSERT_EQ(HttpStatusOf(response), 400) << response;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(response))["code"], 3);
}

// A method nothing implements: 501 with the JSON error body, not a
// "malformed request" 400.
TEST(HttpServer, UnknownMethod_Returns501WithJsonError) {
  HttpServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawConnection connection(*port, absl::Seconds(10));
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(connection.Send("FOO /v1/jobs HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  const std::string response = connection.Read();
  ASSERT_EQ(HttpStatusOf(response), 501) << response;
  EXPECT_NE(response.find("501 Not Implemented"), std::string::npos) << response;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(response))["code"], 12);
}

TEST(HttpServer, Post_ExpectContinue_ContinueThenResponse) {
  HttpServer server;
  server.Post("/echo", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawConnection connection(*port, absl::Seconds(10));
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(
      connection.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nExpect: "
                      "100-continue\r\nContent-Length: 7\r\n\r\n"));
  const std::string interim = connection.Read("\r\n\r\n");
  ASSERT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(connection.Send("{\"x\":1}"));
  const std::string response = connection.Read().substr(interim.size());
  ASSERT_EQ(HttpStatusOf(response), 200) << response;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(response))["body"], "{\"x\":1}");
}

// Clients that hold every connection without finishing a request (and
// reopen each as it times out) turned every new one away with 503, /healthz
// probes included, so liveness probes restarted the pods. A new connection
// now takes the place of the oldest unfinished request.
TEST(HttpServer, Get_ConnectionsAtCapHeldUnfinished_OldestDroppedNewOneServed) {
  HttpServer server({.max_connections = 2});
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  // Connected (and so accepted) in order: these two take both places.
  auto silent = SlowHttpClients::Open(*port, {.connections = 2, .trickling = 0});
  ASSERT_TRUE(silent.ok()) << silent.status();
  for (int probe = 1; probe <= 3; ++probe) {
    httplib::Result result = ClientFor(*port)->Get("/healthz");
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    EXPECT_EQ(result->status, 200) << result->body;
    // The oldest silent one made room for the first probe; an answered
    // probe holds no place, so the next ones fit beside the other.
    EXPECT_EQ((*silent)->CountAnsweredOrClosed(), 1);
  }
}

// Clients that ask for a large answer and never read it hold their places
// (writing) until the response timeout. At the cap, the oldest of them is
// cut off to make room, so /healthz still answers.
TEST(HttpServer, Get_ConnectionsAtCapNotReadingAnswers_OldestCutOffNewOneServed) {
  HttpServer server({.max_connections = 2});
  const std::string big(32 << 20, 'x');  // far beyond the sockets' buffers
  server.Get("/big", [&](const HttpRequest&) { return JsonResponse(200, big); });
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  std::vector<std::unique_ptr<RawConnection>> stalled;
  for (int i = 0; i < 2; ++i) {
    stalled.push_back(std::make_unique<RawConnection>(*port, absl::Seconds(30)));
    ASSERT_TRUE(stalled.back()->connected());
    ASSERT_TRUE(stalled.back()->Send("GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    // The answer has begun (the server is writing it); it is never read.
    ASSERT_TRUE(stalled.back()->AwaitReadable());
  }
  httplib::Result result = ClientFor(*port)->Get("/healthz");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200) << result->body;
  // The oldest was closed: reading it to its end gives less than the answer.
  EXPECT_LT(stalled[0]->Read().size(), big.size());
}

// A handler that counts its calls and answers 200 only once released (or
// after 30 s): requests that hold a handler thread for as long as a test
// needs.
class HeldHandler {
 public:
  HttpServer::Handler Handler() {
    return [this](const HttpRequest&) {
      AnnotatedMutexLock lock(&mu_);
      ++started_;
      mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; },
                           absl::Seconds(30));
      return JsonResponse(200, "{}");
    };
  }
  // Whether `count` calls have started within 30 s.
  bool AwaitStarted(int count) {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return started_ == count; },
        absl::Seconds(30));
  }
  void Release() {
    AnnotatedMutexLock lock(&mu_);
    released_ = true;
  }

 private:
  AnnotatedMutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// Every place taken by a request being handled: nothing to drop, so the
// new connection is turned away at once, and the handled ones finish.
TEST(HttpServer, Get_ConnectionsAtCapAllHandled_NewOneRefused503) {
  HttpServer server({.max_connections = 2});
  HeldHandler slow;
  server.Get("/slow", slow.Handler());
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  std::vector<std::thread> handled;
  std::vector<int> statuses(2, 0);
  for (int i = 0; i < 2; ++i) {
    handled.emplace_back([&, i] {
      httplib::Result result = ClientFor(*port)->Get("/slow");
      statuses[i] = result ? result->status : -1;
    });
  }
  // EXPECTs until the threads are joined: a failed ASSERT would leave them
  // joinable (std::terminate rather than a failure).
  const bool both_handled = slow.AwaitStarted(2);
  EXPECT_TRUE(both_handled);
  httplib::Result refused = ClientFor(*port)->Get("/slow");
  EXPECT_TRUE(refused) << httplib::to_string(refused.error());
  if (both_handled && refused) {
    EXPECT_EQ(refused->status, 503);
    EXPECT_EQ(nlohmann::json::parse(refused->body),
              ErrorBody(14,
                        "the server has the most open connections it accepts "
                        "(2); retry later"));
  }
  slow.Release();
  for (std::thread& t : handled) t.join();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
}

// Every handler thread busy and every place taken by a request being
// handled: a probe is still admitted (past the cap, for probes only) and
// answered at once on its own thread; another request on such a place is
// refused 503 when it is whole.
TEST(HttpServer, Get_AllPlacesTakenBySlowHandlers_ProbeStillAnswered) {
  HttpServer server({.max_connections = 3, .handler_threads = 3});
  HeldHandler slow_handler;
  server.Get("/slow", slow_handler.Handler());
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{\"ok\":true}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  // Three requests, each on a handler thread.
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 3; ++i) {
    slow.push_back(std::make_unique<RawConnection>(*port, absl::Seconds(30)));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  }
  EXPECT_TRUE(slow_handler.AwaitStarted(3));
  for (int i = 0; i < 3; ++i) {
    httplib::Result probe = ImpatientClientFor(*port)->Get("/healthz");
    EXPECT_TRUE(probe) << "probe " << i << ": " << httplib::to_string(probe.error());
    if (probe) EXPECT_EQ(probe->status, 200) << probe->body;
  }
  httplib::Result refused = ImpatientClientFor(*port)->Get("/slow");
  EXPECT_TRUE(refused) << httplib::to_string(refused.error());
  if (refused) EXPECT_EQ(refused->status, 503) << refused->body;
  slow_handler.Release();
  for (auto& connection : slow) {
    EXPECT_NE(connection->Read().find("200 OK"), std::string::npos);
  }
}

// Every place taken by a request being handled, clients alternate a
// connection that sends nothing (admitted for probes only) and a whole
// request. The second turned the first away as the oldest unfinished one
// and took a regular place, so each pair queued one more request (up to
// 1 MiB each) past max_connections. Regular places are counted apart from
// the probes-only ones now: each whole request is refused 503.
TEST(HttpServer, Get_AllPlacesHandled_SilentThenWholeRequestPairs_WholeRequestsRefused503) {
  HeldHandler slow_handler;  // outlives the server, whose handlers use it
  HttpServer server({.max_connections = 3, .handler_threads = 3});
  server.Get("/slow", slow_handler.Handler());
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  std::vector<std::unique_ptr<RawConnection>> held, silent, whole;
  auto connect = [&](std::vector<std::unique_ptr<RawConnection>>& into) {
    into.push_back(std::make_unique<RawConnection>(*port, absl::Seconds(30)));
    return into.back()->connected();
  };
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(connect(held));
    ASSERT_TRUE(held.back()->Send("GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  }
  ASSERT_TRUE(slow_handler.AwaitStarted(3));
  // Connected in order, so the gate takes each silent one before its pair.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(connect(silent));
    ASSERT_TRUE(connect(whole));
    ASSERT_TRUE(whole.back()->Send("GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  }
  // The gate takes connections in order: once a probe connected last is
  // answered, every connection above has its place (a whole request on a
  // probes-only one is refused however soon places free up).
  httplib::Result probe = ClientFor(*port)->Get("/healthz");
  ASSERT_TRUE(probe) << httplib::to_string(probe.error());
  EXPECT_EQ(probe->status, 200) << probe->body;
  // Released only now: a request queued past the cap would be answered 200.
  slow_handler.Release();
  for (auto& connection : held) EXPECT_EQ(HttpStatusOf(connection->Read()), 200);
  for (auto& connection : whole) {
    const std::string response = connection->Read();
    ASSERT_EQ(HttpStatusOf(response), 503) << response;
    EXPECT_EQ(
        nlohmann::json::parse(BodyOf(response)),
        ErrorBody(14, "the server has the most open connections it accepts (3); retry later"));
  }
}

TEST(HttpServer, Read_RequestIncompleteAtDeadline_Returns408AndCloses) {
  HttpServer server({.request_timeout = absl::Milliseconds(200)});
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  auto slow = SlowHttpClients::Open(*port, {.connections = 4, .trickling = 2});
  ASSERT_TRUE(slow.ok()) << slow.status();
  RawConnection connection(*port, absl::Seconds(30));  // only a guard against a hang
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(connection.Send("GET /healthz HTTP/1.1\r\nHost: localhost\r\n"));  // never finished

  const std::string response = connection.Read();  // to the server's close
  ASSERT_EQ(HttpStatusOf(response), 408) << response;
  EXPECT_EQ(nlohmann::json::parse(BodyOf(response)),
            ErrorBody(4,
                      "the request was not complete within the limit of "
                      "200ms after connecting"));
  // Trickling and silent ones alike.
  EXPECT_EQ((*slow)->AwaitAnsweredOrClosed(absl::Seconds(30)), 4);
}

TEST(HttpServer, Stop_SlowClientsConnected_ReturnsAndClosesThem) {
  HttpServer server({.request_timeout = absl::Minutes(10)});
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  auto slow = SlowHttpClients::Open(*port, {.connections = 16, .trickling = 8});
  ASSERT_TRUE(slow.ok()) << slow.status();
  server.Stop();  // a hang here fails the test by its timeout
  EXPECT_EQ((*slow)->AwaitAnsweredOrClosed(absl::Seconds(30)), 16);
}

// Whether a TCP connection to 127.0.0.1:`port` is refused (the server no
// longer listens); asked at most every 10 ms for up to 30 s.
bool AwaitRefused(int port) {
  for (int i = 0; i < 3000; ++i) {
    if (!RawConnection(port, absl::Seconds(1)).connected()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// Stop with a grace answers what it took: requests being handled (a
// submit that did its work, say) get their 200, where Stop without one
// closed their connections unanswered.
TEST(HttpServer, Stop_WithGrace_TakenRequestsAnswered) {
  HttpServer server({.handler_threads = 2});
  HeldHandler slow;
  server.Get("/slow", slow.Handler());
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawConnection first(*port, absl::Seconds(30)), second(*port, absl::Seconds(30));
  ASSERT_TRUE(first.connected() && second.connected());
  ASSERT_TRUE(first.Send("GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  ASSERT_TRUE(second.Send("GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  ASSERT_TRUE(slow.AwaitStarted(2));
  std::thread stopping([&] { server.Stop(absl::Seconds(30)); });
  EXPECT_TRUE(AwaitRefused(*port));  // Stop has begun: it no longer accepts
  slow.Release();
  EXPECT_EQ(HttpStatusOf(first.Read()), 200);
  EXPECT_EQ(HttpStatusOf(second.Read()), 200);
  stopping.join();
}

// Records what HttpServer::Options::on_response reports.
class ResponseLog {
 public:
  using Entry = std::tuple<std::string, std::string, int>;  // method, route, status

  HttpServer::Options Observing(HttpServer::Options options = {}) {
    options.on_response = [this](const std::string& method, const std::string& route, int status,
                                 double seconds) {
      EXPECT_GE(seconds, 0.0);
      std::lock_guard<std::mutex> lock(mu_);
      entries_.emplace_back(method, route, status);
      seconds_.push_back(seconds);
    };
    return options;
  }
  std::vector<Entry> entries() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }
  // The seconds reported with each entry, in the same order.
  std::vector<double> seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return seconds_;
  }

 private:
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<double> seconds_;
};

constexpr char kThingRoute[] = R"(/things/([^/]+))";

TEST(HttpServer, OnResponse_RoutedUnroutedAndHandlerErrors_ReportPatternAndStatus) {
  ResponseLog log;
  HttpServer server(log.Observing());
  server.Get(kThingRoute, Echo);
  server.Post("/bad", [](const HttpRequest&) { return JsonError(400, "INVALID_ARGUMENT", "x"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  auto client = ClientFor(*port);
  ASSERT_TRUE(client->Get("/things/a1?x=1"));
  ASSERT_TRUE(client->Get("/things/b2"));
  ASSERT_TRUE(client->Post("/bad", "{}", "application/json"));
  ASSERT_TRUE(client->Get("/nowhere/at/all"));
  // Each is reported before its response is written: no waiting needed.
  EXPECT_EQ(log.entries(), (std::vector<ResponseLog::Entry>{{"GET", kThingRoute, 200},
                                                            {"GET", kThingRoute, 200},
                                                            {"POST", "/bad", 400},
                                                            {"GET", "unmatched", 404}}));
}

TEST(HttpServer, OnResponse_Unauthenticated_ReportsTheRouteWith401) {
  ResponseLog log;
  HttpServer server(log.Observing({.bearer_token = "s3cret"}));
  server.Get(kThingRoute, Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_TRUE(ClientFor(*port)->Get("/things/a1"));
  EXPECT_EQ(log.entries(), (std::vector<ResponseLog::Entry>{{"GET", kThingRoute, 401}}));
}

TEST(HttpServer, OnResponse_GateAndParserRejections_ReportRejectedRoute) {
  ResponseLog log;
  HttpServer server(log.Observing({.max_body_bytes = 10}));
  server.Post("/echo", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Post("/echo", std::string(11, 'x'), "text/plain");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  ASSERT_EQ(result->status, 413);
  RawConnection connection(*port, absl::Seconds(10));
  ASSERT_TRUE(connection.connected());
  ASSERT_TRUE(connection.Send(
      "BREW /pot HTTP/1.1\r\nHost: localhost\r\n\r\n"));  // a method nothing implements
  ASSERT_EQ(HttpStatusOf(connection.Read()), 501);
  EXPECT_EQ(log.entries(), (std::vector<ResponseLog::Entry>{{"POST", "rejected", 413},
                                                            {"OTHER", "rejected", 501}}));
}

// A request's reported duration runs from the request being complete,
// its wait for a handler thread included (as documented); it began when a
// handler thread picked the request up, so a server whose handlers were all
// busy reported fast answers while clients waited.
TEST(HttpServer, OnResponse_RequestQueuedBehindABusyHandler_SecondsIncludeTheWait) {
  ResponseLog log;
  HeldHandler slow_handler;  // outlives the server, whose handler uses it
  HttpServer server(log.Observing({.max_connections = 2, .handler_threads = 1, .probe_paths = {}}));
  server.Get("/slow", slow_handler.Handler());
  server.Get("/fast", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawConnection held(*port, absl::Seconds(30)), queued(*port, absl::Seconds(30));
  ASSERT_TRUE(held.connected());
  ASSERT_TRUE(held.Send("GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  ASSERT_TRUE(slow_handler.AwaitStarted(1));
  ASSERT_TRUE(queued.connected());
  ASSERT_TRUE(queued.Send("GET /fast HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  // Both places taken: before turning a third connection away, the gate
  // reads the oldest one still reading (`queued`, whole), so once the third
  // has its 503 the queued request is complete and waits for the handler.
  RawConnection third(*port, absl::Seconds(30));
  ASSERT_TRUE(third.connected());
  ASSERT_EQ(HttpStatusOf(third.Read()), 503);
  const absl::Time complete_by = MonotonicClock()->Now();
  absl::SleepFor(absl::Milliseconds(200));  // the wait to be measured
  const double waited = absl::ToDoubleSeconds(MonotonicClock()->Now() - complete_by);
  slow_handler.Release();
  EXPECT_EQ(HttpStatusOf(held.Read()), 200);
  EXPECT_EQ(HttpStatusOf(queued.Read()), 200);
  const std::vector<ResponseLog::Entry> entries = log.entries();
  const std::vector<double> seconds = log.seconds();
  const auto fast =
      std::find(entries.begin(), entries.end(), ResponseLog::Entry{"GET", "/fast", 200});
  ASSERT_NE(fast, entries.end());
  EXPECT_GE(seconds[fast - entries.begin()], waited);
}

TEST(HttpServer, Post_KnownPathWrongMethod_Returns405WithAllow) {
  ResponseLog log;
  HttpServer server(log.Observing());
  server.Get(R"(/things/([^/:]+))", Echo);
  server.Post(R"(/things/([^/:]+):poke)", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Post("/things/a1", "{}", "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 405);
  EXPECT_EQ(result->get_header_value("Allow"), "GET, HEAD");
  nlohmann::json body = nlohmann::json::parse(result->body);
  EXPECT_EQ(body["code"], 12);  // UNIMPLEMENTED, as grpc-gateway answers 405
  EXPECT_EQ(body["message"],
            "method POST is not allowed on /things/a1; allowed: GET, HEAD (see "
            "docs/api.md)");
  result = ClientFor(*port)->Get("/things/a1:poke");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 405);
  EXPECT_EQ(result->get_header_value("Allow"), "POST");
  EXPECT_EQ(log.entries(),
            (std::vector<ResponseLog::Entry>{{"POST", R"(/things/([^/:]+))", 405},
                                             {"GET", R"(/things/([^/:]+):poke)", 405}}));
}

// TRACE and CONNECT, which httplib parses but does not route, are 405 on a
// served path too, not "malformed".
TEST(HttpServer, TraceAndConnectOnAServedPath_Return405WithAllow) {
  HttpServer server;
  server.Get(R"(/things/([^/:]+))", Echo);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  for (const char* method : {"TRACE", "CONNECT"}) {
    SCOPED_TRACE(method);
    RawConnection connection(*port, absl::Seconds(10));
    ASSERT_TRUE(connection.connected());
    ASSERT_TRUE(
        connection.Send(absl::StrCat(method, " /things/a1 HTTP/1.1\r\nHost: localhost\r\n\r\n")));
    const std::string answer = connection.Read();
    EXPECT_EQ(HttpStatusOf(answer), 405) << answer;
    EXPECT_TRUE(absl::StrContains(answer, "Allow: GET, HEAD")) << answer;
  }
}

// The socket-free entry point the REST fuzzer drives answers byte for byte
// as a served connection does: routed, unrouted, unauthenticated, refused
// by the framing and by httplib's parser; and waits for the rest of an
// incomplete request.
TEST(HttpServer, AnswerRequestBytes_SameBytesAsAServedConnection) {
  ResponseLog log;
  HttpServer server(log.Observing({.bearer_token = "s3cret", .max_body_bytes = 10}));
  server.Get(kThingRoute, Echo);
  server.Post("/echo", Echo);
  const std::vector<std::string> requests = {
      "GET /things/a1?x=1 HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer s3cret\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer s3cret\r\nContent-Length: "
      "3\r\n\r\nabc",
      "GET /things/a1 HTTP/1.1\r\nHost: localhost\r\n\r\n",
      "GET /nowhere HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer s3cret\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n\r\n",
      "BREW /pot HTTP/1.1\r\nHost: localhost\r\n\r\n",
  };
  std::vector<std::string> answered;
  for (const std::string& request : requests) {
    answered.push_back(server.AnswerRequestBytes(request));
    EXPECT_NE(HttpStatusOf(answered.back()), 0) << answered.back();
  }
  EXPECT_EQ(server.AnswerRequestBytes("GET /things/a1 HTTP/1.1\r\nHost: localhost\r\n"), "");
  EXPECT_EQ(server.AnswerRequestBytes(requests[1] + "trailing bytes"), answered[1]);
  EXPECT_EQ(log.entries(), (std::vector<ResponseLog::Entry>{{"GET", kThingRoute, 200},
                                                            {"POST", "/echo", 200},
                                                            {"GET", kThingRoute, 401},
                                                            {"GET", "unmatched", 404},
                                                            {"POST", "rejected", 413},
                                                            {"OTHER", "rejected", 501},
                                                            {"POST", "/echo", 200}}));

  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(requests[i]);
    RawConnection connection(*port, absl::Seconds(10));
    ASSERT_TRUE(connection.connected());
    ASSERT_TRUE(connection.Send(requests[i]));
    EXPECT_EQ(connection.Read(), answered[i]);
  }
}

// std::regex routing needs stack in proportion to the path (an 8 KiB one
// overflows a 2 MiB thread stack): a long target is refused before routing.
TEST(HttpServer, Get_RequestLineOverLimit_Returns414NamingTheLimit) {
  ResponseLog log;
  HttpServer server(log.Observing());
  std::atomic<int> calls{0};
  server.Get(kThingRoute, [&calls](const HttpRequest& r) {
    ++calls;
    return Echo(r);
  });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Get("/things/" + std::string(2000, 'a'));
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 414);
  EXPECT_EQ(nlohmann::json::parse(result->body),
            ErrorBody(8,
                      "request line (method, path and query) exceeds the limit of 1024 "
                      "bytes"));
  EXPECT_EQ(calls, 0);
  // The longest line within the limit is routed.
  result = ClientFor(*port)->Get("/things/" + std::string(1024 - 21, 'a'));
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(log.entries(),
            (std::vector<ResponseLog::Entry>{{"GET", "rejected", 414}, {"GET", kThingRoute, 200}}));
}

// The framing answers a request line over its 1 KiB with 414, and httplib
// a header line over its 8 KiB with 400, before routing; both are reported
// as rejected, not matched against the routes.
TEST(HttpServer, OnResponse_LinesOverHttplibsEightKiB_RefusedAndReportedRejected) {
  ResponseLog log;
  HttpServer server(log.Observing());
  server.Get(kThingRoute, Echo);
  const std::string response = server.AnswerRequestBytes(absl::StrCat(
      "GET /things/", std::string(12000, 'a'), " HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  EXPECT_EQ(HttpStatusOf(response), 414) << response;
  // A header line over httplib's 8 KiB (within the gate's 16 KiB): 400.
  const std::string long_header = server.AnswerRequestBytes(absl::StrCat(
      "GET /things/a HTTP/1.1\r\nHost: localhost\r\nX-Long: ", std::string(9000, 'b'), "\r\n\r\n"));
  EXPECT_EQ(HttpStatusOf(long_header), 400) << long_header;
  EXPECT_EQ(log.entries(),
            (std::vector<ResponseLog::Entry>{{"GET", "rejected", 414}, {"GET", "rejected", 400}}));
}

TEST(JsonError, MessageWithQuotesAndInvalidUtf8_IsValidJson) {
  HttpResponse response = JsonError(400, "INVALID_ARGUMENT", "bad \"x\" \xff");
  nlohmann::json body = nlohmann::json::parse(response.body);
  EXPECT_EQ(body["code"], 3);
  EXPECT_TRUE(absl::StartsWith(body["message"].get<std::string>(), "bad \"x\" "));
  EXPECT_EQ(response.status, 400);
}

}  // namespace
}  // namespace pipetrain
