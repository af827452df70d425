// pipetrain.v1.CoordinatorService over gRPC's callback API: a translation layer
// (STYLE.md item 1). Each method hands its request to WorkerRegistry or
// JobManager and returns their absl::Status as the gRPC status with the same
// code and message (see those headers for the codes each method returns).
//
// Authentication comes first (caller_auth.h), before the request is even
// parsed (RawCoordinatorService; RegisterWorker, whose join token is in its
// request, after the size bound alone): a refused call changes nothing, is
// counted in pipetrain_rpc_refused_total{method,code} (and, as every call,
// timed with its code by the RED interceptor), and ends UNAUTHENTICATED or
// PERMISSION_DENIED.
//
// Additions beyond translation:
//   WatchAssignments a stream the worker cancels (its process exited or its
//                    connection broke) marks that incarnation LOST at once
//                    (WorkerRegistry::MarkLost), long before its lease ends.
//   RegisterWorker   after success, ends the worker's streams of older
//                    incarnations and asks JobManager to start queued jobs
//                    (on the service's executor), so a job does not wait for
//                    the scheduling loop's next tick.
//   WatchAssignments validates the worker first (after its credential, which
//                    already refuses an unknown or another worker's id):
//                    FAILED_PRECONDITION (not the current incarnation, or the
//                    worker is LOST/LEFT; it must register again). Then see
//                    assignment_streams.h.
//   UploadWeights    authenticated when the stream opens; see weights_upload.h.
//   ReportProgress   refuses a report whose incarnation is not its session
//                    credential's (FAILED_PRECONDITION: a job runner of an
//                    earlier incarnation); feeds
//                    pipetrain_stage_{busy,idle}_seconds_total and
//                    pipetrain_job_steps_total after JobManager accepted it.
//   GetPlan          a plan over max_plan_reply_bytes (kMaxPlanReplyBytes)
//                    is sent without some of its drawings, named in
//                    Plan.drawings_omitted: the Chrome traces first, then
//                    the SVGs, each measured before predicted, until it fits.
// Every call, refused ones and streams included, is counted and timed by
// the RED interceptor: pipetrain_rpc_{requests_total,duration_seconds}
// {method,code}.
//
// Unary methods run in the gRPC reaction, taking only short locks in the
// registry and job manager, except SubmitJob, CancelJob, DrainWorker and
// RegisterWorker: they wait for the state store (a commit to disk or etcd,
// and CancelJob for the saves queued before its own), so they run on a
// thread of the service's own, one call at a time, and the reaction only
// hands them over (STYLE.md item 6). Shutdown
// order:
//   service.Shutdown();        // ends the never-ending WatchAssignments streams
//   server->Shutdown(deadline);
//   destroy the server, then the service (joins its executor).
//
// Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_API_GRPC_SERVICE_H_
#define PIPETRAIN_COORDINATOR_API_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>

#include "absl/strings/string_view.h"
#include "common/serial_executor.h"
#include "coordinator/api/assignment_streams.h"
#include "coordinator/api/caller_auth.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/api/weights_upload.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain {

// The most bytes of a request of any method but SubmitJob and
// ReportProgress (whose bound is the server's, 4 MiB): the largest of them,
// a RegisterWorkerRequest, holds a join token of at most 4 KiB and a few
// hundred bytes of names (registration_limits.h).
inline constexpr size_t kMaxSmallRequestBytes = 16 << 10;

// The most bytes of a GetPlan reply: the coordinator sends at most 64 MiB
// (main.cc's SetMaxSendMessageSize, the CLI's receive limit too), and a
// large plan's four drawings with a measured step came to about 75 MB, so
// every `job --plan/--timeline/--report` failed RESOURCE_EXHAUSTED. 8 MiB
// under it, as headroom: the reply is measured as serialized here, and a
// limit hit exactly would fail the call for want of a few bytes.
inline constexpr size_t kMaxPlanReplyBytes = 56 << 20;

// CoordinatorService with every method but UploadWeights taking its request
// as bytes. Parsed by gRPC before the method ran, a request of 4 MiB of
// empty repeated or unknown fields grew 16 to 30 times in memory before
// its credential was looked at, on up to 32 streams of every connection
// (grpc_server_limits.h): a stranger needed few connections to exhaust
// the coordinator's memory.
using RawCoordinatorService = v1::CoordinatorService::WithRawCallbackMethod_RegisterWorker<
    v1::CoordinatorService::WithRawCallbackMethod_Heartbeat<
        v1::CoordinatorService::WithRawCallbackMethod_DeregisterWorker<
            v1::CoordinatorService::WithRawCallbackMethod_WatchAssignments<
                v1::CoordinatorService::WithRawCallbackMethod_ReportProgress<
                    v1::CoordinatorService::WithRawCallbackMethod_SubmitJob<
                        v1::CoordinatorService::WithRawCallbackMethod_GetJob<
                            v1::CoordinatorService::WithRawCallbackMethod_ListJobs<
                                v1::CoordinatorService::WithRawCallbackMethod_CancelJob<
                                    v1::CoordinatorService::WithRawCallbackMethod_ListWorkers<
                                        v1::CoordinatorService::WithRawCallbackMethod_GetPlan<
                                            v1::CoordinatorService::
                                                WithRawCallbackMethod_DrainWorker<
                                                    v1::CoordinatorService::
                                                        CallbackService>>>>>>>>>>>>;

class CoordinatorGrpcService final : public RawCoordinatorService {
 public:
  // Runs a task later, on a thread other than the caller's.
  using Runner = std::function<void(std::function<void()>)>;

  // None owned; all must outlive the service. Requires non-null (checked).
  // `store_calls` runs SubmitJob's, CancelJob's and DrainWorker's work, and
  // `registrations` RegisterWorker's; empty: a SerialExecutor of the
  // service's own for each. Registrations have their own: a CancelJob waits
  // for its job's save behind every file and store task already queued, and
  // a fleet's registrations (after a failover) must not wait out their
  // deadlines behind it. Tests pass queues they run themselves, to see that
  // those calls are not answered in the reaction. `max_plan_reply_bytes`
  // bounds GetPlan's reply (tests pass less to see drawings left out).
  CoordinatorGrpcService(WorkerRegistry* workers, JobManager* jobs, AssignmentHub* hub,
                         CoordinatorMetrics* metrics, const CallerAuth* auth,
                         Runner store_calls = {}, Runner registrations = {},
                         size_t max_plan_reply_bytes = kMaxPlanReplyBytes);

  // Ends every WatchAssignments stream with UNAVAILABLE and refuses new ones
  // the same way. Idempotent.
  void Shutdown();

  // Open WatchAssignments streams (for tests and diagnostics).
  int watch_streams() const { return streams_.size(); }

  // Each method takes its request as bytes (the raw methods of the base):
  // parsed only after the caller's credential in the metadata passed and
  // the bytes fit the method's bound (kMaxSmallRequestBytes but for
  // SubmitJob and ReportProgress, the server's 4 MiB). UploadWeights reads
  // no chunk before its credential passed either (weights_upload.h).
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeregisterWorker(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchAssignments(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<v1::WeightsChunk>* UploadWeights(
      grpc::CallbackServerContext* context, v1::UploadWeightsResponse* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  // A user, or the worker named (its own session credential).
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

 private:
  // A unary call whose request parsed: the typed request and answer; the
  // answer is serialized into gRPC's bytes when the call finishes. Deletes
  // itself when gRPC is done with it.
  template <typename Request, typename Response>
  class TypedCall;

  // Answers `credential` when it is an error (counting the refusal), then
  // RESOURCE_EXHAUSTED when `raw` holds more than `max_bytes`, then
  // INVALID_ARGUMENT when it is no `Request`; otherwise hands `body` the
  // call (TypedCall<Request, Response>*), which must finish it (through
  // Unary or OffReaction).
  template <typename Request, typename Response, typename Body>
  grpc::ServerUnaryReactor* Parsed(grpc::CallbackServerContext* context, absl::string_view method,
                                   const absl::Status& credential, size_t max_bytes,
                                   const grpc::ByteBuffer* raw, grpc::ByteBuffer* answer,
                                   Body body);
  // Finishes the call with `authorized` when it is an error (counting the
  // refusal); otherwise runs `handler` (returning absl::Status) and
  // finishes the call with its status (the RED interceptor times it).
  template <typename Call, typename Handler>
  void Unary(Call* call, absl::string_view method, const absl::Status& authorized, Handler handler);
  // As Unary, but `handler` runs through `run` (store_calls_,
  // registrations_ or plan_reads_), after the reaction has returned: it must hold what it
  // uses by value (the call stays valid until it is finished). A call its
  // client gave up on while it waited there (its deadline passed) is
  // answered CANCELLED without running `handler`: the client retries, and
  // a register, submit or cancel abandoned in the queue is not done behind
  // its back (one whose deadline passes while `handler` runs still
  // completes).
  template <typename Call, typename Handler>
  void OffReaction(Call* call, absl::string_view method, const absl::Status& authorized,
                   Handler handler, const Runner& run);
  // Both: the refusal in the reaction, else `handler` through `run`.
  template <typename Call, typename Handler>
  void Respond(Call* call, absl::string_view method, const absl::Status& authorized,
               Handler handler, const Runner& run);
  // The session credential in the call's metadata, for no worker in
  // particular: what a worker method checks before it parses the request
  // naming the worker (then WorkerCall).
  absl::Status AnyWorkerCall(const grpc::CallbackServerContext& context) const;
  absl::Status UserCall(const grpc::CallbackServerContext& context) const;
  absl::Status WorkerCall(const grpc::CallbackServerContext& context,
                          absl::string_view worker_id) const;
  absl::Status CheckWatcher(const v1::WatchAssignmentsRequest& request) const;
  // Counts a call refused by authentication: as a worker's stale session
  // (CallerAuth::IsStaleWorkerSession), or as refused.
  void CountRefusal(const grpc::CallbackServerContext& context, absl::string_view method,
                    const absl::Status& refused);
  void RecordProgress(const v1::ReportProgressRequest& request,
                      const JobManager::ProgressCounted& counted);

  WorkerRegistry* const workers_;
  JobManager* const jobs_;
  CoordinatorMetrics* const metrics_;
  const CallerAuth* const auth_;
  const size_t max_plan_reply_bytes_;
  AssignmentStreams streams_;
  OpenUploads open_uploads_;  // UploadWeights: one stream per worker at a time
  // A scheduling pass posted after a registration and not yet begun: the
  // registrations meanwhile need no pass of their own (a fleet of 4096
  // re-registering after a failover queued 4096 passes, each under the job
  // manager's lock).
  std::atomic<bool> schedule_posted_{false};
  // Last members: destroyed (joined) first, while everything their tasks use
  // still exists (open_uploads_ included).
  SerialExecutor executor_;
  // UploadWeights streams, each on the strand of its worker (by hash): a
  // job's first chunk creates and reserves the whole weights file (slow on
  // a slow volume), and on one shared queue that held every other job's
  // uploads, their ends (so a broken stream's slot stayed taken and its
  // retry was refused past the worker's retry window) and the scheduling
  // passes posted after registrations.
  std::array<SerialExecutor, 4> upload_strands_;
  // GetPlan's renderings, one at a time (through plan_reads_).
  SerialExecutor plan_renders_;
  const Runner plan_reads_ = [this](std::function<void()> task) {
    plan_renders_.Post(std::move(task));
  };
  SerialExecutor own_store_calls_;    // used when no runner was given
  SerialExecutor own_registrations_;  // the same
  Runner store_calls_;
  Runner registrations_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_GRPC_SERVICE_H_
