#include "coordinator/api/follower_http.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/http_response.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string Get(HttpServer& server, const std::string& path, const std::string& token = "") {
  return server.AnswerRequestBytes(absl::StrCat(
      "GET ", path, " HTTP/1.1\r\nHost: t\r\n",
      token.empty() ? "" : absl::StrCat("Authorization: Bearer ", token, "\r\n"), "\r\n"));
}

// A standby answers probes and scrapes as what it is (alive, not ready,
// up) and refuses the API naming the leader, after the token.
TEST(FollowerHttpTest, AliveNotReadyScrapedAndRefusingTheApiNamingTheLeader) {
  ServingHealth health({"pipetrain.v1.CoordinatorService"}, "following: another coordinator leads");
  FollowerMetrics metrics;
  std::string leader = "10.0.0.7:7070";
  HttpServer server({.bearer_token = "secret"});
  ServeFollowerHttp(
      server, &health, [&leader] { return leader; }, [] { return false; }, &metrics);

  EXPECT_EQ(HttpStatusOf(Get(server, "/healthz")), 200);
  const std::string ready = Get(server, "/readyz");
  EXPECT_EQ(HttpStatusOf(ready), 503) << ready;
  EXPECT_TRUE(absl::StrContains(ready, "following: another coordinator leads")) << ready;
  const std::string scraped = Get(server, "/metrics");
  EXPECT_EQ(HttpStatusOf(scraped), 200);
  EXPECT_TRUE(absl::StrContains(scraped, "pipetrain_build_info{")) << scraped;
  EXPECT_TRUE(absl::StrContains(scraped, "process_cpu_seconds_total")) << scraped;
  // No TLS: no expiry series.
  EXPECT_FALSE(absl::StrContains(scraped, "pipetrain_tls_certificate_expiry")) << scraped;

  EXPECT_EQ(HttpStatusOf(Get(server, "/v1/jobs")), 401);
  for (const std::string& path : {"/v1/jobs", "/v1/jobs/job-1/plan", "/v1/workers"}) {
    const std::string refused = Get(server, path, "secret");
    EXPECT_EQ(HttpStatusOf(refused), 503) << refused;
    EXPECT_TRUE(absl::StrContains(refused, "the leader's gRPC address is 10.0.0.7:7070"))
        << refused;
  }
  const std::string post = server.AnswerRequestBytes(
      "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer secret\r\nContent-Length: "
      "2\r\n\r\n{}");
  EXPECT_EQ(HttpStatusOf(post), 503) << post;
  leader.clear();  // between leaders
  EXPECT_TRUE(absl::StrContains(Get(server, "/v1/jobs", "secret"), "no leader is elected yet"));
  EXPECT_EQ(HttpStatusOf(Get(server, "/other", "secret")), 404);
}

// A new leader still loading its state serves these routes too: it says
// so, not that it follows a leader at its own address.
TEST(FollowerHttpTest, LeaderStillLoading_RefusesTheApiSayingSo) {
  ServingHealth health({"pipetrain.v1.CoordinatorService"}, "loading the state");
  FollowerMetrics metrics;
  HttpServer server;
  ServeFollowerHttp(
      server, &health, [] { return std::string("10.0.0.7:7070"); }, [] { return true; }, &metrics);
  const std::string refused = Get(server, "/v1/jobs");
  EXPECT_EQ(HttpStatusOf(refused), 503) << refused;
  EXPECT_TRUE(absl::StrContains(
      refused, "this coordinator leads and is still loading its state; retry shortly"))
      << refused;
  EXPECT_FALSE(absl::StrContains(refused, "10.0.0.7")) << refused;
}

// A standby serving TLS exports its certificate's expiry (alerted on weeks
// before), as the leader does: it serves gRPC with it already.
TEST(FollowerHttpTest, StandbyWithTls_ExportsItsCertificatesExpiry) {
  FollowerMetrics metrics({{"tls-cert", absl::FromUnixSeconds(1900000000)}});
  ServingHealth health({"pipetrain.v1.CoordinatorService"}, "following");
  HttpServer server;
  ServeFollowerHttp(
      server, &health, [] { return std::string(); }, [] { return false; }, &metrics);
  const std::string scraped = Get(server, "/metrics");
  EXPECT_TRUE(
      absl::StrContains(scraped,
                        "pipetrain_tls_certificate_expiry_timestamp_seconds{flag=\"tls-cert\"} "
                        "1900000000"))
      << scraped;
}

}  // namespace
}  // namespace pipetrain
