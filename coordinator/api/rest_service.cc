#include "coordinator/api/rest_service.h"

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/api/list_pages.h"
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

// The query parameter `name`, or "" when absent.
std::string Query(const HttpRequest& request, const std::string& name) {
  auto it = request.query.find(name);
  return it == request.query.end() ? "" : it->second;
}

// ?pageSize= and ?pageToken= into `request` (a List*Request). The bounds are
// ListJobsPage's; here only the syntax.
template <typename ListRequest>
absl::Status ParsePaging(const HttpRequest& http, ListRequest& request) {
  const std::string size = Query(http, "pageSize");
  int32_t page_size = 0;
  if (!size.empty() && !absl::SimpleAtoi(size, &page_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ?pageSize= must be an integer in [0, ", kMaxPageSize, "], got \"",
                     size.substr(0, 32), "\""));
  }
  request.set_page_size(page_size);
  request.set_page_token(Query(http, "pageToken"));
  return absl::OkStatus();
}

// ?view=: JOB_VIEW_BASIC or JOB_VIEW_FULL (or BASIC, FULL); absent: BASIC.
absl::StatusOr<v1::JobView> ParseView(const HttpRequest& http) {
  const std::string text = Query(http, "view");
  v1::JobView view = v1::JOB_VIEW_UNSPECIFIED;
  if (text.empty() || v1::JobView_Parse(text, &view) ||
      v1::JobView_Parse(absl::StrCat("JOB_VIEW_", text), &view)) {
    return view;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "view: ?view= must be JOB_VIEW_BASIC or JOB_VIEW_FULL, got \"", text.substr(0, 32), "\""));
}

HttpResponse GetJob(const JobManager* jobs, const HttpRequest& http) {
  v1::GetJobRequest request;
  request.set_id(http.path_params[0]);
  absl::StatusOr<v1::JobView> view = ParseView(http);
  if (!view.ok()) return StatusResponse(view.status());
  request.set_view(*view);
  return Reply(GetJobInView(*jobs, request));
}

HttpResponse ListJobs(const JobManager* jobs, const HttpRequest& http) {
  v1::ListJobsRequest request;
  absl::Status parsed = ParsePaging(http, request);
  absl::StatusOr<v1::JobView> view = ParseView(http);
  if (parsed.ok()) parsed = view.status();
  if (!parsed.ok()) return StatusResponse(parsed);
  request.set_view(*view);
  return Reply(ListJobsPage(*jobs, request));
}

HttpResponse ListWorkers(const WorkerRegistry* workers, const JobManager* jobs,
                         const HttpRequest& http) {
  v1::ListWorkersRequest request;
  absl::Status parsed = ParsePaging(http, request);
  if (!parsed.ok()) return StatusResponse(parsed);
  return Reply(ListWorkersPage(*workers, *jobs, request));
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
  return JsonError(HttpStatusForCode(status.code()), status);
}

void RegisterRestRoutes(HttpServer& server, const WorkerRegistry* workers, JobManager* jobs) {
  server.Post("/v1/jobs", [jobs](const HttpRequest& r) { return SubmitJob(jobs, r); });
  server.Get("/v1/jobs", [jobs](const HttpRequest& r) { return ListJobs(jobs, r); });
  server.Get(kJob, [jobs](const HttpRequest& r) { return GetJob(jobs, r); });
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
  // The workers' measured timeline of a traced step, once there is one.
  server.Get(absl::StrCat(kJob, "/measured-timeline.svg"), [jobs](const HttpRequest& r) {
    absl::StatusOr<v1::Plan> plan = jobs->GetPlan(r.path_params[0]);
    if (!plan.ok()) return StatusResponse(plan.status());
    if (plan->measured_timeline_svg().empty()) {
      return StatusResponse(absl::FailedPreconditionError(
          absl::StrCat("job ", r.path_params[0],
                       " has no measured step yet: its workers trace the plan's 11th step (or its "
                       "last), then every 100th")));
    }
    HttpResponse response;
    response.body = plan->measured_timeline_svg();
    response.content_type = "image/svg+xml";
    return response;
  });
  server.Get("/v1/workers",
             [workers, jobs](const HttpRequest& r) { return ListWorkers(workers, jobs, r); });
  server.Post(R"(/v1/workers/([^/:]+):drain)",
              [jobs](const HttpRequest& r) { return Reply(jobs->Drain(r.path_params[0])); });
}

}  // namespace pipetrain
