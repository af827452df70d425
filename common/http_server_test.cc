#include "common/http_server.h"

#include <httplib.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
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

HttpResponse Echo(const HttpRequest& request) {
  nlohmann::json body = {{"method", request.method},
                         {"path", request.path},
                         {"params", request.path_params},
                         {"body", request.body}};
  return JsonResponse(200, body.dump());
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
  EXPECT_EQ(body["code"], "NOT_FOUND");
  EXPECT_TRUE(absl::StrContains(body["message"].get<std::string>(), "GET /nowhere"));
}

TEST(HttpServer, HandlerError_KeepsHandlerBody) {
  HttpServer server;
  server.Get("/bad", [](const HttpRequest&) { return JsonError(400, "INVALID_ARGUMENT", "x: bad"); });
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Result result = ClientFor(*port)->Get("/bad");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(nlohmann::json::parse(result->body),
            nlohmann::json({{"code", "INVALID_ARGUMENT"}, {"message", "x: bad"}}));
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
  EXPECT_EQ(body["code"], "UNAUTHENTICATED");
  EXPECT_TRUE(absl::StrContains(body["message"].get<std::string>(), "Authorization: Bearer"));
}

TEST_F(HttpServerAuthTest, WrongToken_Returns401) {
  httplib::Result result = client_->Get("/private", {{"Authorization", "Bearer s3cre7"}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 401);
  EXPECT_TRUE(absl::StrContains(result->body, "wrong bearer token"));
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
  EXPECT_TRUE(absl::StrContains(again.status().message(),
                                "127.0.0.1:" + std::to_string(*port)))
      << again.status();
}

TEST(HttpServer, Stop_Twice_AndNeverStarted_AreNoOps) {
  HttpServer never_started;
  never_started.Stop();
  HttpServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  server.Stop();
  server.Stop();
}

TEST(JsonError, MessageWithQuotesAndInvalidUtf8_IsValidJson) {
  HttpResponse response = JsonError(400, "INVALID_ARGUMENT", "bad \"x\" \xff");
  nlohmann::json body = nlohmann::json::parse(response.body);
  EXPECT_EQ(body["code"], "INVALID_ARGUMENT");
  EXPECT_TRUE(absl::StartsWith(body["message"].get<std::string>(), "bad \"x\" "));
  EXPECT_EQ(response.status, 400);
}

}  // namespace
}  // namespace pipetrain
