#include "coordinator/api/rest_service.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo_input.h"
#include "common/job_state.h"
#include "coordinator/api/grpc_status.h"
#include "coordinator/api/list_pages.h"
#include "coordinator/jobs/plan_drawings.h"
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

// The query parameter `name`, or "" when absent.
std::string Query(const HttpRequest& request, const std::string& name) {
  auto it = request.query.find(name);
  return it == request.query.end() ? "" : it->second;
}

// ?requestId= is SubmitJobRequest.request_id (checked by Submit).
HttpResponse SubmitJob(JobManager* jobs, const HttpRequest& request) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(request.body);
  if (!spec.ok()) return StatusResponse(spec.status());
  return Reply(jobs->Submit(*spec, Query(request, "requestId")));
}

// ?pageSize= and ?pageToken= into `request` (a List*Request). The bounds are
// ListJobsPage's; here only the syntax.
template <typename ListRequest>
absl::Status ParsePaging(const HttpRequest& http, ListRequest& request) {
  const std::string size = Query(http, "pageSize");
  int32_t page_size = 0;
  // Any count of digits is a size: those past kMaxPageSize read as it,
  // beyond int32 (or int64) too, and leading zeros are ignored however many
  // (the request line's own bound, 1 KiB, bounds the scan).
  const bool digits = !size.empty() && std::all_of(size.begin(), size.end(), absl::ascii_isdigit);
  if (digits) {
    const size_t first = size.find_first_not_of('0');  // npos: all zeros
    const std::string significant = first == std::string::npos ? "0" : size.substr(first);
    page_size =
        significant.size() > 4 ? kMaxPageSize : std::min(std::stoi(significant), kMaxPageSize);
  } else if (!size.empty() &&
             // Only "-digits" goes on (refused below as negative, with the
             // bound): SimpleAtoi would also take "+1" and " 1".
             (size[0] != '-' || size.size() == 1 ||
              !std::all_of(size.begin() + 1, size.end(), absl::ascii_isdigit) ||
              !absl::SimpleAtoi(size, &page_size))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: ?pageSize= must be an integer, 0 or more (above ", kMaxPageSize, " reads as ",
        kMaxPageSize, "), got \"", absl::CHexEscape(size.substr(0, 32)), "\""));
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
      "view: ?view= must be JOB_VIEW_BASIC or JOB_VIEW_FULL, got \"", EchoInput(text, 32), "\""));
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
  return Reply(ListJobsPage(*jobs, request, kMaxPageBytes, PageEncoding::kJson));
}

HttpResponse ListWorkers(const WorkerRegistry* workers, const JobManager* jobs,
                         const HttpRequest& http) {
  v1::ListWorkersRequest request;
  absl::Status parsed = ParsePaging(http, request);
  if (!parsed.ok()) return StatusResponse(parsed);
  return Reply(ListWorkersPage(*workers, *jobs, request, kMaxPageBytes, PageEncoding::kJson));
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
  return JsonError(HttpStatusForCode(status.code()), BoundedStatus(status));
}

// `handler`, refusing query parameters other than `known` (400 naming the
// first unknown one): a misspelt ?page_size= would otherwise be ignored,
// and the client get pages of another size without a word.
HttpServer::Handler Taking(std::vector<std::string> known, HttpServer::Handler handler) {
  return [known = std::move(known), handler = std::move(handler)](const HttpRequest& r) {
    // Which of two values counts is nobody's guess to make: refused.
    if (!r.repeated_query.empty()) {
      return StatusResponse(absl::InvalidArgumentError(
          absl::StrCat("query parameter \"", absl::CHexEscape(r.repeated_query[0].substr(0, 32)),
                       "\" given more than once; give it once")));
    }
    for (const auto& [name, value] : r.query) {
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      return StatusResponse(absl::InvalidArgumentError(absl::StrCat(
          "unknown query parameter \"", absl::CHexEscape(name.substr(0, 32)), "\"; ",
          known.empty() ? "this route takes none"
                        : absl::StrCat("this route takes ", absl::StrJoin(known, ", ")))));
    }
    return handler(r);
  };
}

namespace {

// One of job `id`'s plan drawings as an image (`drawing` picks it), or
// FAILED_PRECONDITION from `missing` saying why the plan has none (an
// empty image with 200 would look like a drawing of nothing).
HttpResponse PlanSvg(JobManager& jobs, const std::string& id, JobManager::PlanParts parts,
                     const std::function<const std::string&(const v1::Plan&)>& drawing,
                     absl::Status (*missing)(const std::string&, v1::JobState, bool)) {
  absl::StatusOr<v1::Plan> plan = jobs.GetPlan(id, parts);
  if (!plan.ok()) return StatusResponse(plan.status());
  if (drawing(*plan).empty()) {
    absl::StatusOr<v1::Job> job = jobs.Get(id);
    const v1::JobState state = job.ok() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
    return StatusResponse(missing(id, state, IsTerminal(state)));
  }
  HttpResponse response;
  response.body = drawing(*plan);
  response.content_type = "image/svg+xml";
  return response;
}

}  // namespace

void RegisterRestRoutes(HttpServer& server, const WorkerRegistry* workers, JobManager* jobs) {
  const std::vector<std::string> none;
  server.Post("/v1/jobs",
              Taking({"requestId"}, [jobs](const HttpRequest& r) { return SubmitJob(jobs, r); }));
  server.Get("/v1/jobs", Taking({"pageSize", "pageToken", "view"},
                                [jobs](const HttpRequest& r) { return ListJobs(jobs, r); }));
  server.Get(kJob, Taking({"view"}, [jobs](const HttpRequest& r) { return GetJob(jobs, r); }));
  server.Post(absl::StrCat(kJob, ":cancel"), Taking(none, [jobs](const HttpRequest& r) {
                return Reply(jobs->Cancel(r.path_params[0]));
              }));
  server.Get(absl::StrCat(kJob, "/plan"), Taking(none, [jobs](const HttpRequest& r) {
               return Reply(jobs->GetPlan(r.path_params[0]));
             }));
  // The plan's simulated timeline as an image a browser shows directly.
  server.Get(absl::StrCat(kJob, "/timeline.svg"), Taking(none, [jobs](const HttpRequest& r) {
               return PlanSvg(
                   *jobs, r.path_params[0], JobManager::PlanParts::kWithoutMeasured,
                   [](const v1::Plan& plan) -> const std::string& { return plan.timeline_svg(); },
                   NoTimelineError);
             }));
  // The workers' measured timeline of a traced step, once there is one.
  server.Get(
      absl::StrCat(kJob, "/measured-timeline.svg"), Taking(none, [jobs](const HttpRequest& r) {
        return PlanSvg(
            *jobs, r.path_params[0], JobManager::PlanParts::kMeasuredTimelineSvg,
            [](const v1::Plan& plan) -> const std::string& { return plan.measured_timeline_svg(); },
            NoMeasuredTimelineError);
      }));
  server.Get("/v1/workers",
             Taking({"pageSize", "pageToken"}, [workers, jobs](const HttpRequest& r) {
               return ListWorkers(workers, jobs, r);
             }));
  server.Post(R"(/v1/workers/([^/:]+):drain)", Taking(none, [jobs](const HttpRequest& r) {
                return Reply(jobs->Drain(r.path_params[0]));
              }));
}

}  // namespace pipetrain
