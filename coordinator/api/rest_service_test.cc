#include "coordinator/api/rest_service.h"

#include <httplib.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "coordinator/api/bad_specs_testing.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using nlohmann::json;

// The REST routes and /metrics over a real registry and job manager on a
// fake clock, served on a free loopback port.
class RestServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve(""); }

  void Serve(const std::string& token) {
    server_ = std::make_unique<HttpServer>(HttpServer::Options{.bearer_token = token});
    RegisterRestRoutes(*server_, &workers_, &jobs_);
    ServePrometheus(*server_, metrics_.registry(), [this] { metrics_.Refresh(); });
    absl::StatusOr<int> port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_connection_timeout(10);
    client_->set_read_timeout(10);
    client_->set_write_timeout(10);
  }

  void RegisterWorker() {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:9001");
    ASSERT_TRUE(workers_.Register(request).ok());
  }

  // Status and parsed body of a call; fails the test on transport errors.
  std::pair<int, json> Call(const std::string& method, const std::string& path,
                            const std::string& body = "") {
    httplib::Result result = method == "GET" ? client_->Get(path.c_str())
                                             : client_->Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(result) << method << " " << path << ": " << httplib::to_string(result.error());
    if (!result) return {0, json()};
    EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
    return {result->status, json::parse(result->body, nullptr, /*allow_exceptions=*/false)};
  }

  FakeClock clock_;
  WorkerRegistry workers_{WorkerRegistry::Options{.clock = &clock_}};
  AssignmentHub hub_;
  JobManager jobs_{&workers_, &hub_, &clock_};
  CoordinatorMetrics metrics_{&workers_, &jobs_};
  std::unique_ptr<HttpServer> server_;  // after what its routes use: stops first
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(RestServiceTest, SubmitJob_ValidSpec_ReturnsQueuedJobInCanonicalJson) {
  auto [status, job] = Call("POST", "/v1/jobs", ValidSpecJson());
  EXPECT_EQ(status, 200) << job;
  EXPECT_EQ(job["id"], "job-1");
  EXPECT_EQ(job["state"], "JOB_STATE_QUEUED");
  EXPECT_EQ(job["spec"]["model"]["nLayer"], 2);  // lowerCamel names
  EXPECT_EQ(job["spec"]["training"]["steps"], "10");  // int64 as a string
  EXPECT_EQ(job["spec"]["parallelism"]["solver"], "uniform");  // defaults resolved
  EXPECT_TRUE(job["createTime"].is_string());  // RFC 3339
}

// ?requestId= makes a retried POST return the first job.
TEST_F(RestServiceTest, SubmitJob_RequestIdRepeated_ReturnsTheSameJob) {
  auto [status, job] = Call("POST", "/v1/jobs?requestId=r-1", ValidSpecJson());
  ASSERT_EQ(status, 200) << job;
  EXPECT_EQ(job["requestId"], "r-1");
  auto [again_status, again] = Call("POST", "/v1/jobs?requestId=r-1", ValidSpecJson());
  EXPECT_EQ(again_status, 200) << again;
  EXPECT_EQ(again["id"], job["id"]);
  EXPECT_EQ(jobs_.List().size(), 1u);
  auto [bad_status, bad] = Call("POST", "/v1/jobs?requestId=a%20b", ValidSpecJson());
  EXPECT_EQ(bad_status, 400) << bad;
}

TEST_F(RestServiceTest, SubmitJob_MalformedSpecs_Return400NamingTheField) {
  const std::vector<BadSpec> specs = BadSpecs();
  ASSERT_GE(specs.size(), 10u);
  for (const BadSpec& spec : specs) {
    SCOPED_TRACE(spec.name);
    auto [status, error] = Call("POST", "/v1/jobs", spec.json);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(error["code"], 3);
    ASSERT_TRUE(error["message"].is_string()) << error;
    EXPECT_TRUE(absl::StrContains(error["message"].get<std::string>(), spec.field))
        << error["message"] << " does not name " << spec.field;
  }
  EXPECT_EQ(jobs_.List().size(), 0u);
}

TEST_F(RestServiceTest, SubmitJob_EmptyBody_Returns400) {
  auto [status, error] = Call("POST", "/v1/jobs", "");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["code"], 3);
}

TEST_F(RestServiceTest, ListJobs_PageSize_FollowsNextPageTokenToTheEnd) {
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Call("POST", "/v1/jobs", ValidSpecJson()).first, 200);
  auto [status, first] = Call("GET", "/v1/jobs?pageSize=2");
  ASSERT_EQ(status, 200) << first;
  ASSERT_EQ(first["jobs"].size(), 2u);
  EXPECT_EQ(first["jobs"][0]["id"], "job-1");
  EXPECT_EQ(first["jobs"][1]["id"], "job-2");
  ASSERT_TRUE(first["nextPageToken"].is_string()) << first;
  auto [status2, second] =
      Call("GET", "/v1/jobs?pageSize=2&pageToken=" + first["nextPageToken"].get<std::string>());
  ASSERT_EQ(status2, 200) << second;
  ASSERT_EQ(second["jobs"].size(), 1u);
  EXPECT_EQ(second["jobs"][0]["id"], "job-3");
  EXPECT_FALSE(second.contains("nextPageToken")) << second;      // the last page
  EXPECT_EQ(Call("GET", "/v1/jobs").second["jobs"].size(), 3u);  // default: 100 a page
}

TEST_F(RestServiceTest, ListJobs_BadPagingOrView_Returns400WithFieldViolation) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/jobs?pageSize=-1", "page_size"},
      {"/v1/jobs?pageSize=ten", "page_size"},
      {"/v1/jobs?pageSize=%2B1", "page_size"},  // "+1": digits only
      {"/v1/jobs?pageSize=%201", "page_size"},  // " 1"
      {"/v1/jobs?pageSize=-", "page_size"},
      {"/v1/jobs?pageToken=bm90LWEtdG9rZW4", "page_token"},
      {"/v1/jobs?pageToken=" + std::string(600, 'A'), "page_token"},
      {"/v1/jobs?view=EVERYTHING", "view"},
      {"/v1/jobs/job-1?view=ALL", "view"},
      {"/v1/workers?pageSize=-5", "page_size"},
  };
  for (const auto& [path, field] : cases) {
    SCOPED_TRACE(path.substr(0, 60));
    auto [status, error] = Call("GET", path);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(error["code"], 3);
    ASSERT_EQ(error["details"].size(), 1u) << error;
    EXPECT_EQ(error["details"][0]["@type"], "type.googleapis.com/google.rpc.BadRequest");
    EXPECT_EQ(error["details"][0]["fieldViolations"][0]["field"], field) << error;
  }
}

// Any count of digits is a page size; past 1000 (and past int32) it reads
// as 1000, as documented: of 1001 jobs, such a page holds 1000 and a token
// to the last. Leading zeros are ignored ("000" is 0: the default, 100).
TEST_F(RestServiceTest, ListJobs_HugePageSizes_ReadAsTheMost) {
  // 800 cancelled as submitted: the rest stay within max_pending_jobs (256),
  // the ended within max_ended_jobs (1000), so all 1001 are listed.
  for (int i = 0; i < 1001; ++i) {
    auto [status, job] = Call("POST", "/v1/jobs", ValidSpecJson());
    ASSERT_EQ(status, 200) << job;
    if (i < 800) ASSERT_TRUE(jobs_.Cancel(job["id"].get<std::string>()).ok()) << i;
  }
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"1001", 1000},
      {"2147483648", 1000},
      {"99999999999999999999999", 1000},
      {std::string(65, '9'), 1000},
      {"000", 100},
      {std::string(70, '0') + "5", 5},
  };
  for (const auto& [size, want] : cases) {
    SCOPED_TRACE(size);
    auto [status, page] = Call("GET", absl::StrCat("/v1/jobs?pageSize=", size));
    ASSERT_EQ(status, 200) << page.dump().substr(0, 200);
    EXPECT_EQ(page["jobs"].size(), want);
    ASSERT_TRUE(page["nextPageToken"].is_string());
    if (want != 1000) continue;
    auto [last_status, last] = Call("GET", absl::StrCat("/v1/jobs?pageSize=", size, "&pageToken=",
                                                        page["nextPageToken"].get<std::string>()));
    ASSERT_EQ(last_status, 200) << last;
    ASSERT_EQ(last["jobs"].size(), 1u) << last;
    EXPECT_EQ(last["jobs"][0]["id"], "job-1001");
    EXPECT_FALSE(last.contains("nextPageToken")) << last;
  }
}

// A query parameter a route does not take is refused naming it (a
// misspelt ?page_size= would otherwise give pages of another size).
TEST_F(RestServiceTest, UnknownQueryParameters_Return400NamingThem) {
  for (const std::string& path :
       {std::string("/v1/jobs?page_size=2"), std::string("/v1/workers?view=FULL"),
        std::string("/v1/jobs/job-1/plan?x=1")}) {
    SCOPED_TRACE(path);
    auto [status, error] = Call("GET", path);
    EXPECT_EQ(status, 400);
    EXPECT_TRUE(absl::StrContains(error["message"].get<std::string>(), "unknown query parameter"))
        << error;
  }
  auto [status, error] = Call("GET", "/v1/jobs?page_size=2");
  EXPECT_EQ(error["message"],
            "unknown query parameter \"page_size\"; this route takes pageSize, pageToken, view");
}

// An ended job without a measured step will never have one: the answer
// says so instead of "yet".
TEST_F(RestServiceTest, MeasuredTimeline_JobEndedWithoutOne_SaysSo) {
  RegisterWorker();
  Call("POST", "/v1/jobs", ValidSpecJson());
  jobs_.AwaitBackgroundWork();  // planned, no step traced
  auto [waiting, running_error] = Call("GET", "/v1/jobs/job-1/measured-timeline.svg");
  EXPECT_EQ(waiting, 400);
  EXPECT_TRUE(
      absl::StrContains(running_error["message"].get<std::string>(), "has no measured step yet"))
      << running_error;
  Call("POST", "/v1/jobs/job-1:cancel");
  auto [status, error] = Call("GET", "/v1/jobs/job-1/measured-timeline.svg");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["message"],
            "job job-1 ended CANCELLED with no measured timeline: its workers trace the plan's "
            "11th step (or its last), and the coordinator keeps the trace in memory only, for "
            "jobs not ended and the 16 planned jobs that ended last (a restart loses it)");
}

// A traced step's measured timeline as an image. The route asks GetPlan
// for the measured SVG alone: it copied the whole plan (its predicted
// drawings, tens of megabytes) under the job manager's lock and drew the
// measured Chrome trace too, at every request, to throw both away.
TEST_F(RestServiceTest, MeasuredTimeline_TracedStep_ReturnsOnlyTheSvg) {
  RegisterWorker();
  ASSERT_EQ(Call("POST", "/v1/jobs", ValidSpecJson()).first, 200);
  jobs_.AwaitBackgroundWork();  // planned
  const v1::Job job = jobs_.Get("job-1").value();
  ASSERT_EQ(job.worker_ids_size(), 1) << job.reason();
  std::optional<SequencedAssignment> assignment = hub_.Newer(job.worker_ids(0), 0);
  ASSERT_TRUE(assignment.has_value());
  v1::ReportProgressRequest traced;  // step 10, each instruction 1 ms
  traced.set_worker_id(job.worker_ids(0));
  traced.set_job_id(job.id());
  traced.set_plan_version(1);
  traced.set_iteration(9);
  v1::StepTrace* trace = traced.mutable_trace();
  trace->set_iteration(9);
  const int instructions = assignment->assignment.program().instructions_size();
  trace->set_seconds(0.001 * instructions);
  for (int i = 0; i < instructions; ++i) {
    v1::InstructionTiming* timing = trace->add_instructions();
    timing->set_instruction(i);
    timing->set_start_seconds(0.001 * i);
    timing->set_end_seconds(0.001 * (i + 1));
  }
  ASSERT_TRUE(jobs_.ReportProgress(traced).ok());

  const httplib::Result svg = client_->Get("/v1/jobs/job-1/measured-timeline.svg");
  ASSERT_TRUE(svg) << httplib::to_string(svg.error());
  EXPECT_EQ(svg->status, 200) << svg->body;
  EXPECT_EQ(svg->get_header_value("Content-Type"), "image/svg+xml");
  EXPECT_TRUE(absl::StrContains(svg->body, "measured step 10")) << svg->body.substr(0, 400);
  EXPECT_EQ(svg->body, jobs_.GetPlan("job-1").value().measured_timeline_svg());
  const v1::Plan measured =
      jobs_.GetPlan("job-1", JobManager::PlanParts::kMeasuredTimelineSvg).value();
  EXPECT_EQ(measured.measured_timeline_svg(), svg->body);
  EXPECT_EQ(measured.measured_step(), 9);
  EXPECT_EQ(measured.version(), 1);
  EXPECT_TRUE(measured.measured_chrome_trace_json().empty());
  EXPECT_TRUE(measured.timeline_svg().empty());
  EXPECT_TRUE(measured.chrome_trace_json().empty());
  EXPECT_EQ(measured.stages_size(), 0);
}

// A job whose plan's drawings were dropped (16 planned jobs ended after
// it) answers timeline.svg with why, not an empty image and 200.
TEST_F(RestServiceTest, Timeline_DrawingsDropped_FailedPreconditionNotAnEmptyImage) {
  RegisterWorker();
  for (int i = 1; i <= 17; ++i) {
    ASSERT_EQ(Call("POST", "/v1/jobs", ValidSpecJson()).first, 200);
    jobs_.AwaitBackgroundWork();  // planned
    const std::string job = absl::StrCat("/v1/jobs/job-", i);
    if (i == 1) {
      const httplib::Result svg = client_->Get((job + "/timeline.svg").c_str());
      ASSERT_TRUE(svg);
      EXPECT_EQ(svg->status, 200);
      EXPECT_TRUE(absl::StartsWith(svg->body, "<svg")) << svg->body.substr(0, 40);
    }
    clock_.Advance(absl::Seconds(1));  // each ends after the one before
    ASSERT_EQ(Call("POST", job + ":cancel").first, 200);
  }
  jobs_.ScheduleQueued();  // the pruning pass
  auto [status, error] = Call("GET", "/v1/jobs/job-1/timeline.svg");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["message"],
            "job job-1 ended CANCELLED and its plan keeps no timeline: the coordinator keeps "
            "drawings in memory only, for jobs not ended and the 16 planned jobs that ended "
            "last, and a restart drops them (the plan's numbers stay)");
  const httplib::Result kept = client_->Get("/v1/jobs/job-2/timeline.svg");  // 15 ended after it
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->status, 200);
}

// The JSON parser's message quotes the bad value whole: the answer cuts it
// as gRPC's does (it was 400 KB for a 200,000-digit number, twice).
TEST_F(RestServiceTest, SubmitJob_HugeBadValue_MessageCut) {
  const std::string digits(200000, '9');
  auto [status, error] =
      Call("POST", "/v1/jobs", absl::StrCat(R"({"model": {"nLayer": ")", digits, R"("}})"));
  EXPECT_EQ(status, 400);
  const std::string message = error["message"].get<std::string>();
  EXPECT_LE(message.size(), 1024u);
  EXPECT_TRUE(absl::StrContains(message, " more bytes]")) << message.substr(0, 200);
  EXPECT_LE(error.dump().size(), 4096u);
}

// A bad ?view= comes back escaped and cut, never a piece of a character.
TEST_F(RestServiceTest, BadView_EchoedEscapedAndCut) {
  auto [status, error] = Call("GET", "/v1/jobs?view=%1B%5B2J" + std::string(40, 'x') + "%C3%A9");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["message"],
            "view: ?view= must be JOB_VIEW_BASIC or JOB_VIEW_FULL, got \"\\x1b[2J" +
                std::string(28, 'x') + "...\"");
}

// An unknown field's violation names the field, not "spec"; an empty body
// says it is empty.
TEST_F(RestServiceTest, SubmitJob_UnknownFieldOrEmptyBody_NamedPlainly) {
  auto [status, error] = Call("POST", "/v1/jobs", R"({"model": {"nLayers": 2}})");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["details"][0]["fieldViolations"][0]["field"], "spec.model.nLayers") << error;
  auto [empty_status, empty] = Call("POST", "/v1/jobs", "");
  EXPECT_EQ(empty_status, 400);
  EXPECT_TRUE(absl::StrContains(empty["message"].get<std::string>(), "the JSON text is empty"))
      << empty;
}

// A parameter given twice is refused: which value counts is no guess to
// make (the first won, silently).
TEST_F(RestServiceTest, RepeatedQueryParameter_Returns400NamingIt) {
  auto [status, error] = Call("GET", "/v1/jobs?pageSize=1&view=FULL&pageSize=2");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["message"], "query parameter \"pageSize\" given more than once; give it once");
}

// An encoded ':' or '/' in the path is refused before routing: httplib
// decoded it, so "job-1%3Acancel" cancelled job-1 past proxy rules on the
// raw path.
TEST_F(RestServiceTest, PercentEncodedPath_Returns400AndNothingRuns) {
  Call("POST", "/v1/jobs", ValidSpecJson());
  const std::string id = "job-1";
  client_->set_url_encode(false);
  auto [status, error] = Call("POST", absl::StrCat("/v1/jobs/", id, "%3Acancel"));
  EXPECT_EQ(status, 400);
  EXPECT_TRUE(absl::StrContains(error["message"].get<std::string>(),
                                "percent-encoded characters in the path"))
      << error;
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_QUEUED);
}

TEST_F(RestServiceTest, ListWorkers_PageSizeOne_PagesThroughBoth) {
  for (const char* address : {"127.0.0.1:9001", "127.0.0.1:9002"}) {
    v1::RegisterWorkerRequest request;
    request.set_data_address(address);
    ASSERT_TRUE(workers_.Register(request).ok());
  }
  auto [status, first] = Call("GET", "/v1/workers?pageSize=1");
  ASSERT_EQ(status, 200) << first;
  ASSERT_EQ(first["workers"].size(), 1u);
  auto [status2, second] =
      Call("GET", "/v1/workers?pageSize=1&pageToken=" + first["nextPageToken"].get<std::string>());
  ASSERT_EQ(status2, 200) << second;
  ASSERT_EQ(second["workers"].size(), 1u);
  EXPECT_NE(first["workers"][0]["id"], second["workers"][0]["id"]);
  EXPECT_FALSE(second.contains("nextPageToken"));
}

TEST_F(RestServiceTest, GetJob_ViewFull_Accepted) {
  Call("POST", "/v1/jobs", ValidSpecJson());
  EXPECT_EQ(Call("GET", "/v1/jobs/job-1?view=JOB_VIEW_FULL").first, 200);
  EXPECT_EQ(Call("GET", "/v1/jobs/job-1?view=FULL").first, 200);
  EXPECT_EQ(Call("GET", "/v1/jobs?view=JOB_VIEW_BASIC").first, 200);
  EXPECT_EQ(Call("GET", "/v1/jobs?view=JOB_VIEW_UNSPECIFIED").first, 200);  // BASIC, as in gRPC
}

TEST_F(RestServiceTest, GetJob_Unknown_Returns404) {
  auto [status, error] = Call("GET", "/v1/jobs/job-42");
  EXPECT_EQ(status, 404);
  EXPECT_EQ(error["code"], 5);
  EXPECT_TRUE(absl::StrContains(error["message"].get<std::string>(), "job-42"));
}

TEST_F(RestServiceTest, GetJob_Submitted_ReturnsIt) {
  Call("POST", "/v1/jobs", ValidSpecJson());
  auto [status, job] = Call("GET", "/v1/jobs/job-1");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(job["id"], "job-1");
  EXPECT_EQ(job["state"], "JOB_STATE_QUEUED");
}

TEST_F(RestServiceTest, ListJobs_Empty_ReturnsEmptyObject) {
  auto [status, list] = Call("GET", "/v1/jobs");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(list, json::object());  // proto3 JSON omits empty repeated fields
}

TEST_F(RestServiceTest, ListJobs_Two_InSubmissionOrder) {
  Call("POST", "/v1/jobs", ValidSpecJson());
  Call("POST", "/v1/jobs", ValidSpecJson());
  auto [status, list] = Call("GET", "/v1/jobs");
  EXPECT_EQ(status, 200);
  ASSERT_EQ(list["jobs"].size(), 2u) << list;
  EXPECT_EQ(list["jobs"][0]["id"], "job-1");
  EXPECT_EQ(list["jobs"][1]["id"], "job-2");
}

// A second cancel is a repeat (a retry whose first answer was lost): 200
// with the job again.
TEST_F(RestServiceTest, CancelJob_Queued_CancelledThenSecondCancelAnsweredAlike) {
  Call("POST", "/v1/jobs", ValidSpecJson());
  auto [status, job] = Call("POST", "/v1/jobs/job-1:cancel");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(job["state"], "JOB_STATE_CANCELLED");
  EXPECT_EQ(job["reason"], "cancelled by the user");

  auto [again, repeat] = Call("POST", "/v1/jobs/job-1:cancel");
  EXPECT_EQ(again, 200);
  EXPECT_EQ(repeat["state"], "JOB_STATE_CANCELLED");
  EXPECT_EQ(repeat["reason"], "cancelled by the user");
}

TEST_F(RestServiceTest, CancelJob_Unknown_Returns404) {
  auto [status, error] = Call("POST", "/v1/jobs/job-7:cancel");
  EXPECT_EQ(status, 404);
  EXPECT_EQ(error["code"], 5);
}

TEST_F(RestServiceTest, GetPlan_QueuedJob_Returns400FailedPrecondition) {
  Call("POST", "/v1/jobs", ValidSpecJson());
  auto [status, error] = Call("GET", "/v1/jobs/job-1/plan");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["code"], 9);
}

TEST_F(RestServiceTest, GetPlan_RunningJob_ReturnsPlan) {
  RegisterWorker();
  auto [submitted, job] = Call("POST", "/v1/jobs", ValidSpecJson());
  // Placed at once, planned in the background.
  ASSERT_TRUE(job["state"] == "JOB_STATE_PLANNING" || job["state"] == "JOB_STATE_RUNNING") << job;
  jobs_.AwaitBackgroundWork();
  auto [status, plan] = Call("GET", "/v1/jobs/job-1/plan");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(plan["jobId"], "job-1");
  EXPECT_EQ(plan["version"], "1");
  ASSERT_EQ(plan["stages"].size(), 1u) << plan;
  EXPECT_EQ(plan["stages"][0]["workerId"], "w-1");
}

TEST_F(RestServiceTest, ListWorkers_OneRegistered_ReturnsIt) {
  RegisterWorker();
  auto [status, list] = Call("GET", "/v1/workers");
  EXPECT_EQ(status, 200);
  ASSERT_EQ(list["workers"].size(), 1u) << list;
  EXPECT_EQ(list["workers"][0]["id"], "w-1");
  EXPECT_EQ(list["workers"][0]["incarnation"], "1");
  EXPECT_EQ(list["workers"][0]["state"], "WORKER_STATE_READY");
  EXPECT_EQ(list["workers"][0]["dataAddress"], "127.0.0.1:9001");
  EXPECT_FALSE(list["workers"][0].contains("drained")) << list;  // false: absent
}

// A drained worker stays READY but gets no job: the listing says drained.
TEST_F(RestServiceTest, ListWorkers_AfterDrain_DrainedTrue) {
  RegisterWorker();
  auto [drain_status, drained] = Call("POST", "/v1/workers/w-1:drain");
  EXPECT_EQ(drain_status, 200) << drained;
  EXPECT_EQ(drained["drained"], true) << drained;
  auto [status, list] = Call("GET", "/v1/workers");
  EXPECT_EQ(status, 200);
  ASSERT_EQ(list["workers"].size(), 1u) << list;
  EXPECT_EQ(list["workers"][0]["state"], "WORKER_STATE_READY");
  EXPECT_EQ(list["workers"][0]["drained"], true) << list;
}

// The NCCL unique id lets its holder join the worker's NCCL bootstrap; it
// is for device groups only, not for the user-facing listing.
TEST_F(RestServiceTest, ListWorkers_WorkerWithNcclId_IdNotListed) {
  v1::RegisterWorkerRequest request;
  request.set_data_address("127.0.0.1:9001");
  request.mutable_device()->set_gpu_index(3);
  request.mutable_device()->set_nccl_unique_id("secret-id");
  ASSERT_TRUE(workers_.Register(request).ok());
  httplib::Result result = client_->Get("/v1/workers");
  ASSERT_TRUE(result);
  EXPECT_FALSE(absl::StrContains(result->body, "ncclUniqueId")) << result->body;
  const json list = json::parse(result->body);
  ASSERT_EQ(list["workers"].size(), 1u) << list;
  EXPECT_EQ(list["workers"][0]["device"]["gpuIndex"], 3);
}

TEST_F(RestServiceTest, UnknownEndpoint_Returns404Json) {
  auto [status, error] = Call("GET", "/v1/nothing/here");
  EXPECT_EQ(status, 404);
  EXPECT_EQ(error["code"], 5);
}

TEST_F(RestServiceTest, KnownPathWrongMethod_Returns405WithAllow) {
  httplib::Result result = client_->Get("/v1/jobs/job-1:cancel");  // cancel is POST
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 405);
  EXPECT_EQ(result->get_header_value("Allow"), "POST");
  result = client_->Post("/v1/workers", "{}", "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 405);
  EXPECT_EQ(result->get_header_value("Allow"), "GET, HEAD");
  EXPECT_EQ(json::parse(result->body)["code"], 12);
}

TEST_F(RestServiceTest, Metrics_AfterRegistration_CountsTheWorker) {
  RegisterWorker();
  httplib::Result result = client_->Get("/metrics");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_TRUE(absl::StrContains(result->body, "# TYPE pipetrain_workers gauge")) << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "pipetrain_workers{state=\"READY\"} 1"))
      << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "pipetrain_jobs{state=\"QUEUED\"} 0"));
}

// A drained READY worker is counted apart: READY in pipetrain_workers
// overstates what jobs can use.
TEST_F(RestServiceTest, Metrics_DrainedWorker_CountedInWorkersDrained) {
  RegisterWorker();
  ASSERT_TRUE(jobs_.Drain("w-1").ok());
  httplib::Result result = client_->Get("/metrics");
  ASSERT_TRUE(result);
  EXPECT_TRUE(absl::StrContains(result->body, "pipetrain_workers{state=\"READY\"} 1"))
      << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "pipetrain_workers_drained 1")) << result->body;
}

// A stage that reported busy time and never waited has its idle series
// at 0 too, so the bubble fraction idle / (busy + idle) reads 0.
TEST_F(RestServiceTest, Metrics_StageThatNeverWaits_HasAnIdleSeriesAtZero) {
  metrics_.AddStageTime(0, 1.5, 0);
  httplib::Result result = client_->Get("/metrics");
  ASSERT_TRUE(result);
  EXPECT_TRUE(
      absl::StrContains(result->body, "pipetrain_stage_busy_seconds_total{stage=\"0\"} 1.5"))
      << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "pipetrain_stage_idle_seconds_total{stage=\"0\"} 0"))
      << result->body;
}

class RestServiceAuthTest : public RestServiceTest {
 protected:
  void SetUp() override { Serve("t0ken"); }
};

TEST_F(RestServiceAuthTest, ListJobs_WithoutToken_Returns401) {
  auto [status, error] = Call("GET", "/v1/jobs");
  EXPECT_EQ(status, 401);
  EXPECT_EQ(error["code"], 16);
}

TEST_F(RestServiceAuthTest, ListJobs_WithToken_Returns200) {
  client_->set_bearer_token_auth("t0ken");
  auto [status, list] = Call("GET", "/v1/jobs");
  EXPECT_EQ(status, 200);
}

TEST_F(RestServiceAuthTest, Metrics_WithoutToken_Returns200) {
  httplib::Result metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
}

}  // namespace
}  // namespace pipetrain
