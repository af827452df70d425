#include "common/metrics/http_red_metrics.h"

#include "common/http_server.h"
#include "common/metrics/metrics_testing.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace pipetrain {
namespace {

using testing::SeriesValue;

constexpr char kRequests[] = "pipetrain_http_requests_total";
constexpr char kDuration[] = "pipetrain_http_request_duration_seconds";

TEST(HttpRedMetrics, AddRoute_NoRequests_OkSeriesAtZero) {
  prometheus::Registry registry;
  HttpRedMetrics red(registry);
  red.AddRoute("GET", "/v1/jobs/([^/:]+)");
  const std::map<std::string, std::string> labels = {
      {"method", "GET"}, {"route", "/v1/jobs/([^/:]+)"}, {"code", "200"}};
  EXPECT_EQ(SeriesValue(registry, kRequests, labels), 0.0);
  EXPECT_EQ(SeriesValue(registry, kDuration, labels), 0.0);
}

TEST(HttpRedMetrics, Observe_KnownAndUnknownRoutes_UnknownCountedAsOther) {
  prometheus::Registry registry;
  HttpRedMetrics red(registry);
  red.AddRoute("GET", "/v1/jobs");
  red.Observe("GET", "/v1/jobs", 200, 0.001);
  red.Observe("GET", "/v1/jobs", 200, 0.002);
  red.Observe("POST", "/v1/jobs", 405, 0.001);  // a declared route, another method
  red.Observe("GET", "", 404, 0.001);           // matched no route
  red.Observe("BREW", "/v1/nothing", 404, 0.001);
  EXPECT_EQ(
      SeriesValue(registry, kRequests, {{"method", "GET"}, {"route", "/v1/jobs"}, {"code", "200"}}),
      2.0);
  EXPECT_EQ(
      SeriesValue(registry, kDuration, {{"method", "GET"}, {"route", "/v1/jobs"}, {"code", "200"}}),
      2.0);
  EXPECT_EQ(SeriesValue(registry, kRequests,
                        {{"method", "POST"}, {"route", "/v1/jobs"}, {"code", "405"}}),
            1.0);
  EXPECT_EQ(
      SeriesValue(registry, kRequests, {{"method", "GET"}, {"route", "other"}, {"code", "404"}}),
      1.0);
  EXPECT_EQ(
      SeriesValue(registry, kRequests, {{"method", "other"}, {"route", "other"}, {"code", "404"}}),
      1.0);
}

TEST(HttpRedMetrics, DeclareRoutes_LiveServer_EveryAnswerCountedByRoutePattern) {
  prometheus::Registry registry;
  HttpRedMetrics red(registry);
  HttpServer server({.bearer_token = "t", .on_response = red.Observer()});
  server.Get(R"(/v1/jobs/([^/:]+))", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  server.Get("/healthz", [](const HttpRequest&) { return JsonResponse(200, "{}"); });
  red.DeclareRoutes(server);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(
      SeriesValue(registry, kRequests, {{"method", "GET"}, {"route", "/healthz"}, {"code", "200"}}),
      0.0);

  httplib::Client client("127.0.0.1", *port);
  const httplib::Headers bearer = {{"Authorization", "Bearer t"}};
  EXPECT_EQ(client.Get("/v1/jobs/job-1", bearer)->status, 200);
  EXPECT_EQ(client.Get("/v1/jobs/job-2", bearer)->status, 200);
  EXPECT_EQ(client.Get("/v1/jobs/job-3")->status, 401);
  EXPECT_EQ(client.Get("/healthz")->status, 200);
  EXPECT_EQ(client.Get("/nowhere", bearer)->status, 404);
  server.Stop();

  const std::string job = R"(/v1/jobs/([^/:]+))";
  EXPECT_EQ(SeriesValue(registry, kRequests, {{"method", "GET"}, {"route", job}, {"code", "200"}}),
            2.0);
  EXPECT_EQ(SeriesValue(registry, kDuration, {{"method", "GET"}, {"route", job}, {"code", "200"}}),
            2.0);
  EXPECT_EQ(SeriesValue(registry, kRequests, {{"method", "GET"}, {"route", job}, {"code", "401"}}),
            1.0);
  EXPECT_EQ(
      SeriesValue(registry, kRequests, {{"method", "GET"}, {"route", "/healthz"}, {"code", "200"}}),
      1.0);
  EXPECT_EQ(SeriesValue(registry, kRequests,
                        {{"method", "GET"}, {"route", "unmatched"}, {"code", "404"}}),
            1.0);
}

}  // namespace
}  // namespace pipetrain
