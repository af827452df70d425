// RED metrics end to end: after a scripted session against a real
// coordinator and worker (a short job, then every gRPC method and every
// REST route, error cases included), each method and route shows in the
// scrapes with its status code, a request count and a latency histogram,
// and `promtool check metrics` accepts both scrapes.
//
// The lists of methods and routes come from the scrapes themselves: every
// known method has its code="OK" series and every route its code="200"
// series from the start (at zero), so a method or route that the server
// knows but this session did not reach fails the test.
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "common/grpc_credentials.h"
#include "common/ports_file.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

// The samples of a text exposition (label values unescaped).
std::vector<Sample> ParseExposition(const std::string& text) {
  std::vector<Sample> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample sample;
    size_t i = line.find_first_of("{ ");
    sample.name = line.substr(0, i);
    if (i != std::string::npos && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        const std::string key = line.substr(i, eq - i);
        std::string value;
        for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
          if (line[i] == '\\' && i + 1 < line.size()) ++i;
          value += line[i];
        }
        sample.labels[key] = value;
        i += line[i + 1] == ',' ? 2 : 1;
      }
      ++i;
    }
    absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(i)), &sample.value);
    samples.push_back(std::move(sample));
  }
  return samples;
}

// What one server's RED metrics say: per key (a method, or "METHOD route"),
// the codes with a non-zero request count, and the keys known up front.
struct Red {
  std::set<std::string> known;                         // keys with a zero-initialised series
  std::map<std::string, std::set<std::string>> codes;  // key -> codes counted
  std::map<std::string, double> histogram_counts;      // key -> _count over codes
};

Red ReadRed(const std::vector<Sample>& samples, const std::string& counter,
            const std::string& histogram, bool http) {
  Red red;
  for (const Sample& s : samples) {
    const std::string key =
        http ? s.labels.count("route") > 0
                   ? absl::StrCat(s.labels.at("method"), " ", s.labels.at("route"))
                   : ""
             : (s.labels.count("method") > 0 ? s.labels.at("method") : "");
    if (key.empty()) continue;
    if (s.name == counter) {
      red.known.insert(key);
      if (s.value > 0) red.codes[key].insert(s.labels.at("code"));
    } else if (s.name == histogram + "_count") {
      red.histogram_counts[key] += s.value;
    }
  }
  return red;
}

std::pair<int, std::string> Promtool(const std::string& text, const std::string& name) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string in = dir + "/" + name + ".prom", out = dir + "/" + name + ".promtool";
  std::ofstream(in) << text;
  const int status =
      std::system(("promtool check metrics < " + in + " > " + out + " 2>&1").c_str());
  std::ifstream result(out);
  return {status, std::string(std::istreambuf_iterator<char>(result), {})};
}

grpc::ByteBuffer EmptyMessage() {
  grpc::Slice empty(std::string(""));
  return grpc::ByteBuffer(&empty, 1);
}

// Calls `method` (a full name) of type `type` with empty messages, as a
// client that knows no better would; returns the status. Streams are ended
// by the client after at most one message.
grpc::StatusCode CallRaw(grpc::Channel* channel, const std::string& method,
                         grpc::internal::RpcMethod::RpcType type) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::internal::RpcMethod rpc(method.c_str(), type);
  grpc::ByteBuffer request = EmptyMessage(), response;
  switch (type) {
    case grpc::internal::RpcMethod::NORMAL_RPC:
      return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
                 channel, rpc, &context, request, &response)
          .error_code();
    case grpc::internal::RpcMethod::SERVER_STREAMING: {
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, rpc, &context,
                                                                        request));
      if (reader->Read(&response)) context.TryCancel();  // e.g. a health Watch never ends
      return reader->Finish().error_code();
    }
    case grpc::internal::RpcMethod::CLIENT_STREAMING: {
      std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
          grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, rpc, &context,
                                                                        &response));
      writer->Write(request);
      writer->WritesDone();
      return writer->Finish().error_code();
    }
    case grpc::internal::RpcMethod::BIDI_STREAMING: {
      std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
          grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
              channel, rpc, &context));
      stream->Write(request);
      stream->WritesDone();
      if (stream->Read(&response)) context.TryCancel();
      return stream->Finish().error_code();
    }
  }
  return grpc::StatusCode::UNKNOWN;
}

// The type of every method a pipetrain server may know: from the protos,
// plus gRPC's health checking and reflection.
std::map<std::string, grpc::internal::RpcMethod::RpcType> MethodTypes() {
  std::map<std::string, grpc::internal::RpcMethod::RpcType> types = {
      {"/grpc.health.v1.Health/Check", grpc::internal::RpcMethod::NORMAL_RPC},
      {"/grpc.health.v1.Health/Watch", grpc::internal::RpcMethod::SERVER_STREAMING},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
       grpc::internal::RpcMethod::BIDI_STREAMING}};
  for (const char* name :
       {v1::CoordinatorService::service_full_name(), v1::DataPlaneService::service_full_name(),
        v1::WorkerControlService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* m = service->method(i);
      types[absl::StrCat("/", service->full_name(), "/", m->name())] =
          m->client_streaming()
              ? (m->server_streaming() ? grpc::internal::RpcMethod::BIDI_STREAMING
                                       : grpc::internal::RpcMethod::CLIENT_STREAMING)
              : (m->server_streaming() ? grpc::internal::RpcMethod::SERVER_STREAMING
                                       : grpc::internal::RpcMethod::NORMAL_RPC);
    }
  }
  return types;
}

// Calls every method `red` knows on `channel`; fails for one this test
// cannot type.
void CallEveryMethod(grpc::Channel* channel, const Red& red, const std::string& server) {
  const auto types = MethodTypes();
  for (const std::string& method : red.known) {
    if (method == "other") continue;
    const auto it = types.find(method);
    ASSERT_NE(it, types.end()) << server << " knows " << method << ", which this test cannot call";
    CallRaw(channel, method, it->second);
  }
}

// A path for `route` (a registered pattern): each capture group becomes
// `id`.
std::string PathOf(const std::string& route, const std::string& id) {
  return absl::StrReplaceAll(route, {{"([^/:]+)", id}});
}

// Requests every route `red` knows on 127.0.0.1:`port`, with `token`.
void RequestEveryRoute(int port, const Red& red, const std::string& token, const std::string& id) {
  httplib::Client client("127.0.0.1", port);
  const httplib::Headers bearer = {{"Authorization", "Bearer " + token}};
  for (const std::string& key : red.known) {
    const std::string method = key.substr(0, key.find(' ')), route = key.substr(key.find(' ') + 1);
    if (route == "other" || route == "unmatched" || route == "rejected") continue;
    ASSERT_EQ(route.find('('), route.find("([^/:]+)")) << "cannot fill in the route " << route;
    const std::string path = PathOf(route, id);
    auto response = method == "GET" ? client.Get(path.c_str(), bearer)
                                    : client.Post(path.c_str(), bearer, "{}", "application/json");
    ASSERT_TRUE(response) << key;
  }
}

// Every known method or route was counted with some code and timed.
void ExpectEveryKeyObserved(const Red& red, const std::string& what, const std::string& scrape) {
  ASSERT_FALSE(red.known.empty()) << what << ": nothing known\n" << scrape;
  for (const std::string& key : red.known) {
    if (key == "other" || absl::EndsWith(key, " other") || absl::EndsWith(key, " unmatched") ||
        absl::EndsWith(key, " rejected")) {
      continue;
    }
    EXPECT_TRUE(red.codes.count(key) > 0 && !red.codes.at(key).empty())
        << what << " " << key << " was never counted";
    EXPECT_GT(red.histogram_counts.count(key) ? red.histogram_counts.at(key) : 0.0, 0.0)
        << what << " " << key << " has no latency observations";
  }
}

std::string Join(const std::set<std::string>& codes) {
  std::string out;
  for (const std::string& c : codes) absl::StrAppend(&out, out.empty() ? "" : ",", c);
  return out;
}

TEST(RedMetricsTest, ScriptedSession_EveryMethodAndRouteWithItsCode_PromtoolClean) {
  ASSERT_EQ(std::system("command -v promtool > /dev/null"), 0)
      << "promtool is missing: run scripts/setup.sh (Debian package prometheus)";
  auto cluster = testing::StartTestCluster("red", 1);
  ASSERT_NE(cluster, nullptr);
  const std::string token = cluster->user_token();

  // A short job: registration, heartbeats, assignments, progress reports.
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", token);
  const std::string id = testing::SubmitJob(*stub, testing::TinyJobSpec(/*steps=*/2));
  const v1::Job job = testing::AwaitJob(*stub, id, absl::Seconds(60), testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();

  // Every gRPC method of both servers, with empty requests (mostly errors).
  const std::string worker_ports = absl::StrCat(std::getenv("TEST_TMPDIR"), "/red/worker-0.ports");
  absl::StatusOr<int> data_port = ReadPort(worker_ports, "data_port");
  ASSERT_TRUE(data_port.ok()) << data_port.status();
  const int worker_metrics_port = testing::WorkerMetricsPort("red", 0);
  std::vector<Sample> coordinator = ParseExposition(testing::ScrapeMetrics(cluster->http_port()));
  std::vector<Sample> worker = ParseExposition(testing::ScrapeMetrics(worker_metrics_port));
  const std::string rpc = "pipetrain_rpc_requests_total", rpc_h = "pipetrain_rpc_duration_seconds";
  const std::string http = "pipetrain_http_requests_total",
                    http_h = "pipetrain_http_request_duration_seconds";
  auto coordinator_channel =
      BearerChannel(cluster->grpc_address(), grpc::InsecureChannelCredentials(), {}, token);
  auto worker_channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", *data_port),
                                            grpc::InsecureChannelCredentials());
  CallEveryMethod(coordinator_channel.get(), ReadRed(coordinator, rpc, rpc_h, false),
                  "coordinator");
  CallEveryMethod(worker_channel.get(), ReadRed(worker, rpc, rpc_h, false), "worker");
  // Error cases with known codes.
  v1::GetJobRequest missing;
  missing.set_id("job-that-never-was");
  v1::Job unused;
  grpc::ClientContext get_context;
  get_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  EXPECT_EQ(stub->GetJob(&get_context, missing, &unused).error_code(), grpc::StatusCode::NOT_FOUND);
  auto anonymous = ConnectCoordinator(cluster->grpc_address(), "", "");
  grpc::ClientContext anonymous_context;
  anonymous_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListJobsResponse jobs;
  EXPECT_EQ(anonymous->ListJobs(&anonymous_context, v1::ListJobsRequest(), &jobs).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Every REST route of both servers: with the job's id (mostly 200), with
  // a missing id (404), without a token (401), and a path nobody serves.
  const Red coordinator_routes = ReadRed(coordinator, http, http_h, true);
  RequestEveryRoute(cluster->http_port(), coordinator_routes, token, id);
  RequestEveryRoute(cluster->http_port(), coordinator_routes, token, "job-that-never-was");
  RequestEveryRoute(worker_metrics_port, ReadRed(worker, http, http_h, true), "", id);
  httplib::Client rest("127.0.0.1", cluster->http_port());
  ASSERT_TRUE(rest.Get("/v1/jobs"));  // no token: 401
  ASSERT_TRUE(rest.Get("/no/such/endpoint", {{"Authorization", "Bearer " + token}}));  // 404

  // Scrape again: every method and route counted with its code and timed.
  const std::string coordinator_text = testing::ScrapeMetrics(cluster->http_port());
  const std::string worker_text = testing::ScrapeMetrics(worker_metrics_port);
  coordinator = ParseExposition(coordinator_text);
  worker = ParseExposition(worker_text);
  const Red coordinator_rpc = ReadRed(coordinator, rpc, rpc_h, false);
  const Red worker_rpc = ReadRed(worker, rpc, rpc_h, false);
  const Red coordinator_http = ReadRed(coordinator, http, http_h, true);
  const Red worker_http = ReadRed(worker, http, http_h, true);
  ExpectEveryKeyObserved(coordinator_rpc, "coordinator gRPC", coordinator_text);
  ExpectEveryKeyObserved(worker_rpc, "worker gRPC", worker_text);
  ExpectEveryKeyObserved(coordinator_http, "coordinator REST", coordinator_text);
  ExpectEveryKeyObserved(worker_http, "worker HTTP", worker_text);
  for (const auto& [name, red] :
       std::vector<std::pair<std::string, const Red*>>{{"coordinator gRPC", &coordinator_rpc},
                                                       {"worker gRPC", &worker_rpc},
                                                       {"coordinator REST", &coordinator_http},
                                                       {"worker HTTP", &worker_http}}) {
    for (const auto& [key, codes] : red->codes) {
      std::printf("%-18s %-70s %s\n", name.c_str(), key.c_str(), Join(codes).c_str());
    }
  }

  // The codes the script caused on purpose.
  const std::string coordinator_service = "/pipetrain.v1.CoordinatorService/";
  EXPECT_EQ(coordinator_rpc.codes.at(coordinator_service + "SubmitJob").count("OK"), 1u);
  EXPECT_EQ(coordinator_rpc.codes.at(coordinator_service + "GetJob").count("NOT_FOUND"), 1u);
  EXPECT_EQ(coordinator_rpc.codes.at(coordinator_service + "ListJobs").count("UNAUTHENTICATED"),
            1u);
  EXPECT_EQ(coordinator_rpc.codes.at(coordinator_service + "ReportProgress").count("OK"), 1u);
  const std::string job_route = "GET /v1/jobs/([^/:]+)";
  EXPECT_EQ(coordinator_http.codes.at(job_route), (std::set<std::string>{"200", "404"}));
  EXPECT_EQ(coordinator_http.codes.at("GET /v1/jobs").count("401"), 1u);
  // REST refusals are counted with the gRPC ones, for the same alert.
  EXPECT_TRUE(absl::StrContains(
      coordinator_text,
      "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"GET /v1/jobs\"}"))
      << coordinator_text;
  EXPECT_EQ(coordinator_http.codes.at("GET unmatched").count("404"), 1u);
  EXPECT_EQ(worker_http.codes.at("GET /metrics").count("200"), 1u);

  // promtool lints both scrapes.
  for (const auto& [name, text] :
       {std::pair<std::string, std::string>{"coordinator", coordinator_text},
        {"worker", worker_text}}) {
    const auto [status, output] = Promtool(text, name);
    EXPECT_EQ(status, 0) << "promtool check metrics on the " << name << "'s /metrics:\n" << output;
    EXPECT_EQ(output, "") << name;
    std::printf("promtool check metrics, %s: exit %d, %zu bytes of output\n", name.c_str(), status,
                output.size());
  }
}

}  // namespace
}  // namespace pipetrain
