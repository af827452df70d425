#include "coordinator/api/rest_service.h"

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

// Job ids ("job-1") never contain '/' or ':', which separate the id from a
// custom method (":cancel") or a sub-resource ("/plan").
constexpr char kJob[] = R"(/v1/jobs/([^/:]+))";

HttpResponse JsonOf(const google::protobuf::Message& message) {
  std::string json;
  // protobuf 3.21 returns its own util::Status, not absl::Status.
  google::protobuf::util::Status printed =
      google::protobuf::util::MessageToJsonString(message, &json);
  if (!printed.ok()) {
    return StatusResponse(absl::InternalError(absl::StrCat(
        "cannot print ", message.GetTypeName(), " as JSON: ", printed.message().ToString())));
  }
  return JsonResponse(200, std::move(json));
}

template <typename Message>
HttpResponse Reply(const absl::StatusOr<Message>& result) {
  return result.ok() ? JsonOf(*result) : StatusResponse(result.status());
}

HttpResponse SubmitJob(JobManager* jobs, const HttpRequest& request) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(request.body);
  if (!spec.ok()) return StatusResponse(spec.status());
  return Reply(jobs->Submit(*spec));
}

HttpResponse ListJobs(const JobManager* jobs) {
  v1::ListJobsResponse response;
  for (v1::Job& job : jobs->List()) *response.add_jobs() = std::move(job);
  return JsonOf(response);
}

HttpResponse ListWorkers(const WorkerRegistry* workers) {
  v1::ListWorkersResponse response;
  for (v1::Worker& worker : workers->List()) *response.add_workers() = std::move(worker);
  return JsonOf(response);
}

}  // namespace

int HttpStatusForCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;  // UNKNOWN, INTERNAL, DATA_LOSS
  }
}

HttpResponse StatusResponse(const absl::Status& status) {
  return JsonError(HttpStatusForCode(status.code()), absl::StatusCodeToString(status.code()),
                   status.message());
}

void RegisterRestRoutes(HttpServer& server, const WorkerRegistry* workers, JobManager* jobs) {
  server.Post("/v1/jobs", [jobs](const HttpRequest& r) { return SubmitJob(jobs, r); });
  server.Get("/v1/jobs", [jobs](const HttpRequest&) { return ListJobs(jobs); });
  server.Get(kJob, [jobs](const HttpRequest& r) { return Reply(jobs->Get(r.path_params[0])); });
  server.Post(absl::StrCat(kJob, ":cancel"),
              [jobs](const HttpRequest& r) { return Reply(jobs->Cancel(r.path_params[0])); });
  server.Get(absl::StrCat(kJob, "/plan"),
             [jobs](const HttpRequest& r) { return Reply(jobs->GetPlan(r.path_params[0])); });
  // The plan's simulated timeline as an image a browser shows directly.
  server.Get(absl::StrCat(kJob, "/timeline.svg"), [jobs](const HttpRequest& r) {
    absl::StatusOr<v1::Plan> plan = jobs->GetPlan(r.path_params[0]);
    if (!plan.ok()) return StatusResponse(plan.status());
    HttpResponse response;
    response.body = plan->timeline_svg();
    response.content_type = "image/svg+xml";
    return response;
  });
  server.Get("/v1/workers", [workers](const HttpRequest&) { return ListWorkers(workers); });
  server.Post(R"(/v1/workers/([^/:]+):drain)",
              [jobs](const HttpRequest& r) { return Reply(jobs->Drain(r.path_params[0])); });
}

}  // namespace pipetrain
