// The REST API: the user-facing Coordinator methods over HTTP with proto3
// canonical JSON (lowerCamel field names, enums as names, 64-bit integers as
// strings, fields holding their default omitted). A translation layer
// (STYLE.md item 1); docs/api.md and docs/openapi.yaml describe it for users.
//
//   POST /v1/jobs                 body: a JobSpec          -> Job
//   GET  /v1/jobs   ?pageSize= &pageToken= &view=          -> ListJobsResponse
//   GET  /v1/jobs/{id}   ?view=                            -> Job
//   POST /v1/jobs/{id}:cancel     body ignored             -> Job
//   GET  /v1/jobs/{id}/plan                                -> Plan
//   GET  /v1/jobs/{id}/timeline.svg                        -> the plan's timeline (SVG)
//   GET  /v1/jobs/{id}/measured-timeline.svg               -> the measured one (SVG)
//   GET  /v1/workers   ?pageSize= &pageToken=              -> ListWorkersResponse
//   POST /v1/workers/{id}:drain   body ignored             -> Worker
//
// /healthz and /readyz are the process's, not the API's (common/serving_health.h).
//
// POST /v1/jobs takes the JobSpec itself as the body (as grpc-gateway's
// `body: "spec"` would), parsed strictly by JobSpecFromJson: unknown fields
// and values of the wrong type are INVALID_ARGUMENT naming the field.
//
// Paging and views as the gRPC methods (coordinator/api/list_pages.h);
// view is JOB_VIEW_BASIC (default: no progress.lossHistory) or JOB_VIEW_FULL.
//
// Errors: google.rpc.Status JSON, {"code": 3, "message": "...", "details":
// [...]} (common/rpc_status.h; a BadRequest detail names the field), with
// the HTTP status of HttpStatusForCode (the google.rpc / grpc-gateway
// mapping). A known path with another method: 405 with an Allow header.
//
// Thread-safe: handlers only call the thread-safe registry and job manager.
#ifndef PIPETRAIN_COORDINATOR_API_REST_SERVICE_H_
#define PIPETRAIN_COORDINATOR_API_REST_SERVICE_H_

#include "absl/status/status.h"
#include "common/http_server.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"

namespace pipetrain {

// Registers the routes above on `server`, which must not be started yet.
// `workers` and `jobs` are not owned and must outlive the server.
void RegisterRestRoutes(HttpServer& server, const WorkerRegistry* workers, JobManager* jobs);

// The HTTP status for a google.rpc code (as grpc-gateway maps them):
//   OK 200, INVALID_ARGUMENT 400, FAILED_PRECONDITION 400, OUT_OF_RANGE 400,
//   UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404,
//   ALREADY_EXISTS 409, ABORTED 409, RESOURCE_EXHAUSTED 429, CANCELLED 499,
//   UNKNOWN 500, INTERNAL 500, DATA_LOSS 500, UNIMPLEMENTED 501,
//   UNAVAILABLE 503, DEADLINE_EXCEEDED 504.
int HttpStatusForCode(absl::StatusCode code);

// The error response for a non-OK `status`.
HttpResponse StatusResponse(const absl::Status& status);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_REST_SERVICE_H_
