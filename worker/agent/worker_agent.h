// WorkerAgent: a worker's membership in the cluster.
//
// Start() registers with the coordinator (retrying with backoff + jitter
// until it succeeds or Stop() is called), then runs two threads:
//  - heartbeats every interval the coordinator asked for, carrying the
//    current instruction; if the coordinator no longer knows this
//    incarnation (NOT_FOUND / FAILED_PRECONDITION, or UNAUTHENTICATED: its
//    session credential died with a coordinator restart) the agent stops
//    its job and registers again; if that registration is refused
//    (UNAUTHENTICATED: the join token is no longer accepted;
//    INVALID_ARGUMENT: what the worker says of itself is out of bounds;
//    FAILED_PRECONDITION: this worker's build is not the coordinator's)
//    nothing more can be done, and options.on_registration_refused says so
//    (UNIMPLEMENTED is retried then: a proxy in front of the coordinator
//    answers so during a rollout);
//  - watches assignments (server stream, reopened with backoff when it
//    breaks, at once when the agent registers again meanwhile: a restarted
//    coordinator's jobs wait for it): RUN starts a JobRunner (replacing one of another job or plan
//    version), STOP stops the runner of that job. An assignment read from
//    the stream of an incarnation the agent has since registered past is
//    ignored: its session is over.
// Stop() stops the heartbeats, deregisters (the coordinator shows it LEFT,
// and a job it ran fails or recovers saying it was shut down), then closes
// the assignment stream and stops the runner.
//
// Credentials: the join token goes only into RegisterWorker; every other
// call carries the session credential registration returned ("authorization:
// Bearer ..."), kept in a SessionCredential that the worker's WorkerControl
// service also checks callers against.
//
// A coordinator out of reach: the heartbeats', registration tries' and
// assignment stream's failures are each logged at once, then at most once
// a minute with how many were not, and the first heartbeat answered after
// them says how many failed over how long ("coordinator reachable again
// after N failed heartbeats over D", N counting the beats sent again at
// once after a move to another address); every failed call is counted in
// pipetrain_worker_coordinator_call_failures_total (options.metrics), but
// for the assignment stream the worker cancels itself to reopen it as a
// new registration (one the coordinator cancels is counted). A stream that
// delivers, or that the worker reopens so, starts its warnings anew.
//
// Device groups: a worker whose backend can join NCCL groups reports a
// fresh communicator id at registration (DeviceInfo.nccl_unique_id, with
// its GPU's index). When an assignment's device group or replica device
// group carries that id, the coordinator has used it up: the next
// heartbeat brings a new one.
// Thread-safe.
#ifndef PIPETRAIN_WORKER_AGENT_WORKER_AGENT_H_
#define PIPETRAIN_WORKER_AGENT_WORKER_AGENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/connection_hint.h"
#include "common/coordinator_endpoints.h"
#include "grpcpp/grpcpp.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"
#include "worker/agent/backoff.h"
#include "worker/agent/call_cancel.h"
#include "worker/agent/job_runner.h"
#include "worker/agent/session_credential.h"
#include "worker/transport/data_plane_server.h"

namespace pipetrain {

class WorkerMetrics;

// How long a stage's final weights upload (UploadWeights, `bytes` of
// values) may take: 10 minutes, or as long as those bytes take at
// kWeightsUploadFloorBytesPerSecond, whichever is longer. Every stage
// uploads at once at a job's end, into the coordinator's few write
// strands; a fixed 10 minutes failed large stages' uploads, which the job
// took for a peer failure and retrained from its last checkpoint, again
// and again.
inline constexpr int64_t kWeightsUploadFloorBytesPerSecond = int64_t{4} << 20;
absl::Duration WeightsUploadDeadline(int64_t bytes);

// How long one heartbeat waits for its answer: `rpc_timeout`, but for a
// worker given a `lease` (RegisterWorkerResponse.lease_seconds; none: 0 or
// less) at most max(interval, lease - 2 * interval). Beats go one at a
// time, the next an interval after this one's answer: a beat recorded but
// answered late (the coordinator's jobs lock held) kept the next from
// being sent within the lease (rpc_timeout 10 s against the default 5 s
// lease), and a healthy worker was marked LOST and its job recovered.
// Given up in time, the next beat leaves an interval before the lease ends.
absl::Duration HeartbeatDeadline(absl::Duration rpc_timeout, absl::Duration lease,
                                 absl::Duration interval);

struct WorkerAgentOptions {
  // host:port, or a comma-separated list of highly available coordinators
  // (the leader is followed).
  std::string coordinator_address;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure
  // What `credentials` hold, for the hints in connection warnings.
  ClientTlsSetup coordinator_tls;
  std::string join_token;
  std::string node_name;
  std::string metrics_address;  // advertised, may be empty
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration recv_timeout = absl::Seconds(60);
  BackoffOptions backoff;
  // Where stages compute (not owned; outlives the agent); reported at
  // registration with the device's facts.
  Backend* backend = CpuBackend();
  // JobRunnerOptions::on_backend_failure for every job.
  std::function<void(const absl::Status&)> on_backend_failure;
  // Registering again after the coordinator dropped this worker was
  // refused (UNAUTHENTICATED, INVALID_ARGUMENT, FAILED_PRECONDITION for a
  // build other than the coordinator's, with the coordinator's message;
  // not UNIMPLEMENTED, which is retried: see Start): the agent
  // sends no more heartbeats, so the process should end (and its
  // supervisor restart it with a valid token). Called once, from the
  // heartbeat thread; may be null.
  std::function<void(const absl::Status&)> on_registration_refused;
  // Called with false when the coordinator dropped this worker (it
  // registers again), and with true once it is registered again, from the
  // heartbeat thread; may be null. The worker's readiness follows it.
  std::function<void(bool registered)> on_registration_change;
  // --memory-limit: caps DeviceInfo.memory_limit_bytes (what the
  // coordinator plans against) below physical memory and the cgroup's
  // limit. 0: no cap of its own.
  int64_t memory_limit_bytes = 0;
  // --memory-reserve: DeviceInfo.memory_reserve_bytes, which the
  // coordinator takes off what it plans this worker with. 0: none.
  int64_t memory_reserve_bytes = 0;
  // The data plane serves and dials with TLS (--data-tls-*), reported at
  // registration (RegisterWorkerRequest.data_plane_tls).
  bool data_plane_tls = false;
  // --emulate-link, reported in DeviceInfo for the planner; 0: none.
  double emulated_bandwidth_bytes_per_second = 0;
  double emulated_latency_seconds = 0;
  // The data plane's cost per message measured at start-up
  // (worker/transport/data_plane_probe.h); 0: not measured.
  double data_plane_overhead_seconds = 0;
  double data_plane_bytes_per_second = 0;
  // JobRunnerOptions::data_roots for every job (the --data-root flag).
  std::vector<std::string> data_roots;
  // JobRunnerOptions::checkpoint_root (the --checkpoint-root flag).
  std::string checkpoint_root;
  // JobRunnerOptions::checkpoint_hold (--test-hold-checkpoint).
  CheckpointHold checkpoint_hold;
  // Where the agent keeps its session credential (not owned; outlives the
  // agent). Null: the agent keeps its own.
  SessionCredential* session = nullptr;
  // Counts the failed calls to the coordinator (heartbeats, registration
  // tries, assignment streams, progress reports; not owned; outlives the
  // agent). Null: not counted.
  WorkerMetrics* metrics = nullptr;
  // Paces the warnings of repeated failures (a minute apart; not owned).
  // Tests step a FakeClock.
  Clock* clock = MonotonicClock();
};

// The most a clean shutdown's DeregisterWorker call waits (with
// WorkerAgentOptions::rpc_timeout, if shorter; Leave shares it with a
// registration it cut off, see there): a coordinator that cannot be
// reached finds the worker gone by its lease instead.
inline constexpr absl::Duration kDeregisterTimeout = absl::Seconds(2);

class WorkerAgent {
 public:
  // `data_plane` (with its mailbox) must outlive the agent.
  WorkerAgent(WorkerAgentOptions options, DataPlaneServer* data_plane, Mailbox* mailbox,
              TransportFactory make_transport, IterationObserver observer = nullptr);
  ~WorkerAgent();  // Stop()

  // Blocks until registered; CANCELLED if Stop() came first; UNAUTHENTICATED
  // at once when the coordinator rejects the join token, INVALID_ARGUMENT
  // when it refuses what the registration says (a --node-name over its
  // bound, a device fact out of range), FAILED_PRECONDITION when it refuses
  // this worker's build (not its own), UNIMPLEMENTED naming the address
  // when what answers there serves gRPC but not the coordinator's API (a
  // worker's --listen port, etcd): retrying cannot help either.
  // RESOURCE_EXHAUSTED (a registry at its most workers), UNAVAILABLE and
  // the like are retried; so is UNIMPLEMENTED when registering again later
  // (the address served the coordinator: a proxy in front of it answers
  // 404, which gRPC reports as UNIMPLEMENTED, during a rollout).
  absl::Status Start();
  // Leave() then the runner's stop. Idempotent.
  void Stop();
  // Stop()'s first part: stops the heartbeats, deregisters and closes the
  // assignment stream, each bounded by its RPC deadline; the job's stage
  // still runs (a STOP that comes meanwhile leaves it to Stop()). For a shutdown that
  // bounds the stage's stop alone (--stop-timeout-seconds): the coordinator
  // has seen the worker leave before that clock starts. A heartbeat or a
  // registration again (after the coordinator dropped this worker) in
  // flight is cancelled, not waited for (up to rpc_timeout); a registration
  // cut off so is sent once more, said drained, so that the incarnation it
  // may have made is the one deregistered: the two calls share
  // kDeregisterTimeout (or the RPC timeout, if shorter). Idempotent.
  void Leave();
  // Before a clean shutdown, as soon as it is decided: asks the coordinator
  // to drain this worker (DrainWorker), whether or not a job runs here, so
  // that no job is placed on it from now on, and a job it runs re-plans
  // without it at the next step boundary, redoing nothing. OK when not
  // registered (the registration, when it comes, says drained; nothing is
  // logged, as nothing was drained) or drained (logged); the coordinator's
  // refusal otherwise (a job without checkpoints; the caller stops anyway,
  // and the job then recovers from its last checkpoint or fails; or this
  // worker's session gone stale, IsStaleSessionRefusal, drain_retry.h: see
  // AwaitRegisteredAgain). Either way every later registration says
  // drained (one after the coordinator forgot this worker too).
  // When the coordinator answers that this worker is ASSIGNED to a job
  // whose runner has not started (a plan being made, its RUN on the way),
  // the drain waits for that job's word too (AwaitDrained). `cancel` (may
  // be null) cuts the call off (the heartbeat thread's, which Leave
  // cancels).
  absl::Status RequestDrain(CallCancel* cancel = nullptr);
  // After a drain refused for this worker's session gone stale (the
  // coordinator restarted or failed over): waits up to `timeout` for the
  // heartbeat loop, whose heartbeat is refused so too, to register again,
  // said drained, with a session the coordinator takes. That registration
  // is the drain: the new incarnation holds no job (the coordinator
  // restored its jobs to recover from their last checkpoints, and the
  // loop stopped the runner first), and a recovering job does not wait
  // for a drained worker; a drain asked then is granted at once (see
  // drain_retry.h for why it is asked all the same); one asked before is
  // refused again. OK once registered past the refused session, or at
  // once when no drain was refused so; at once, the refusal's code and
  // message, when the loop gave up on a refused registration
  // (options.on_registration_refused): none comes; DEADLINE_EXCEEDED
  // otherwise; CANCELLED once stopping. Logs nothing: a caller may wait in
  // slices (to hear a second signal).
  absl::Status AwaitRegisteredAgain(absl::Duration timeout);
  // Then: waits up to `timeout` for a job running here, or the job the
  // drain's answer named, to let it go. OK when nothing holds this worker
  // or the job let go; DEADLINE_EXCEEDED otherwise. Logs nothing: a caller
  // may wait in slices (to hear a second signal).
  absl::Status AwaitDrained(absl::Duration timeout);
  // Asks the coordinator again (DrainWorker is idempotent) whether this
  // worker is still assigned to the job the drain's answer named: a
  // placement it abandons (a cancel while planning, a plan refused for
  // memory) sends the worker no word. Quiet; its errors are the call's,
  // each try bounded by kRecheckDrainTimeout (or the RPC timeout if less).
  absl::Status RecheckDrain();
  static constexpr absl::Duration kRecheckDrainTimeout = absl::Seconds(2);

  std::string worker_id() const;
  std::string current_instruction() const;
  // current_instruction() and, read with it, HeartbeatRequest.last_job_id:
  // the job of the last assignment taken ("" before any).
  std::pair<std::string, std::string> InstructionAndLastJob() const;
  // How long a runner started now sends its reports again while the
  // coordinator cannot take them: ReportRetryForLease of the lease and
  // heartbeat interval the last registration was given.
  absl::Duration ReportRetryFor() const;
  // Tests: whether an AwaitDrained is waiting (past its first look) within
  // `timeout`.
  bool AwaitDrainWaitingForTesting(absl::Duration timeout) const;
  // Tests: waits until a registration has waited out (or is waiting out) a
  // backoff after a failed attempt; false after `timeout`.
  bool AwaitRegistrationBackoffForTesting(absl::Duration timeout) const;

 private:
  class GrpcLink;
  // Registers, retrying with backoff until answered, refused or stopped.
  // `cancel` (may be null) cuts off the call in flight; a call cut off is
  // settled (SettleCutOffRegistration) and CANCELLED returned. UNIMPLEMENTED
  // is a refusal only when `first` (Start's; see there), retried otherwise.
  // An answer whose session token could not be sent as metadata (not one
  // word of printable ASCII: gRPC would abort) is a failed attempt, retried.
  absl::Status RegisterWithRetry(CallCancel* cancel, bool first);
  struct CoordinatorStub;
  // A registration Leave cut off, or one stopped after an attempt that
  // failed otherwise than by a refusal (its deadline), may yet commit: the
  // same request again (its registration_id), said drained, within half of
  // Leave's deregistration bound; its answer, the incarnation the first
  // made or a new one, is recorded for Deregister. Best effort: a
  // coordinator too slow to answer it in time keeps what the cut-off
  // attempt made (READY, or drained) until its lease ends. An attempt that
  // could not have committed (a refused connection, a follower's
  // UNAVAILABLE) is settled all the same: the coordinator then makes a
  // drained incarnation that is deregistered at once (one LEFT entry).
  void SettleCutOffRegistration(v1::RegisterWorkerRequest request,
                                const CoordinatorStub& coordinator);
  // Takes a successful registration's answer, once its session token passed
  // the check above (UsableRegistration, worker_agent.cc).
  void RecordRegistrationLocked(const v1::RegisterWorkerRequest& request,
                                const v1::RegisterWorkerResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rpc(stub, context)` with the session credential and a deadline of
  // `timeout`, twice at most: right after a failover the first may reach a
  // follower, whose UNAVAILABLE names the leader (CoordinatorEndpoints
  // follows it). For calls made once, not in a loop of their own. `cancel`
  // (may be null) cuts off the call in flight and the retry (CANCELLED).
  template <typename Rpc>
  grpc::Status CallLeader(absl::Duration timeout, Rpc rpc, CallCancel* cancel = nullptr);
  void HeartbeatLoop();
  void WatchLoop();
  // `stream_incarnation`: the incarnation the assignment's stream was opened
  // as; the runner reports as it. Ignored unless it is the current one.
  void Handle(const v1::Assignment& assignment, int64_t stream_incarnation);
  void StopRunner();
  void StopRunnerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runner_change_mu_);
  // DrainWorker (each try bounded by `timeout`, cut off by `cancel` if not
  // null), and assigned_job_ set (or cleared) from its answer. `*granted`
  // (may be null) says whether a coordinator granted it: false when not
  // registered (nothing asked, OK) or refused.
  absl::Status AskDrain(absl::Duration timeout, CallCancel* cancel = nullptr,
                        bool* granted = nullptr);
  // Whether no job holds this worker (AwaitDrained): no RUN being taken, no
  // job named by the drain's answer still to come, and no runner or a
  // completed one.
  bool LetGoLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deregister();  // once, after Stop() has stopped everything else
  // The NCCL id for the next heartbeat: a fresh one when an assignment
  // used group_id_, or one not yet delivered; empty otherwise, and when NCCL
  // fails (the worker then seeds no more groups; its links stay on gRPC).
  std::string GroupIdToReport();
  // Sleeps up to `d`; false when Stop() was called meanwhile.
  bool SleepUnlessStopped(absl::Duration d);

  WorkerAgentOptions options_;
  DataPlaneServer* data_plane_;
  Mailbox* mailbox_;
  TransportFactory make_transport_;
  IterationObserver observer_;
  // The coordinators (one, or several that elect a leader) and a stub on
  // the current one, made per call: the leader may change between calls.
  // A failed call hands `channel` back to endpoints_->Failed, which moves
  // on only if no other call has already.
  std::unique_ptr<CoordinatorEndpoints> endpoints_;
  struct CoordinatorStub {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::CoordinatorService::Stub> stub;
  };
  CoordinatorStub Stub();
  std::unique_ptr<GrpcLink> link_;
  v1::DeviceInfo device_;  // set in the constructor, but for nccl_unique_id
  SessionCredential own_session_;
  SessionCredential* const session_;  // options_.session or &own_session_

  // Held for a whole change of runner: StopRunner's Stop() and ClearJob,
  // Handle's stop, SetJob, OpenJob and start. Without it the heartbeat
  // thread's StopRunner, blocked in the old runner's Stop(), cleared the
  // data plane after the watch thread had set it up for the next job.
  AnnotatedMutex runner_change_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable AnnotatedMutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool deregistered_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;  // wakes the heartbeat loop
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;   // successful ones, this process
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  int64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  // A heartbeat's answer said this process is drained; every later
  // registration says so (RegisterWorkerRequest.drained), so the drain
  // outlives a coordinator restart. Never cleared: a new process is not.
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  // The lease the coordinator holds this worker to (ReportRetryForLease).
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // registrations_ when the session of a drain the coordinator refused as
  // stale was sent (AwaitRegisteredAgain waits to pass it); 0: none was.
  int64_t stale_drain_registration_ ABSL_GUARDED_BY(mu_) = 0;
  // Why the heartbeat loop gave up registering again (a refusal, before
  // options.on_registration_refused); OK while it has not.
  absl::Status registration_refused_ ABSL_GUARDED_BY(mu_);
  // AwaitDrained calls waiting on mu_ (AwaitDrainWaitingForTesting).
  int drain_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  // Backoffs RegisterWithRetry began (AwaitRegistrationBackoffForTesting).
  int64_t registration_backoffs_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The heartbeat thread's call in flight (a heartbeat, or a registration
  // again), which Leave() cancels (and every later one).
  CallCancel heartbeat_cancel_;
  // SettleCutOffRegistration took half of the bound it shares with
  // Deregister, which has the other half.
  bool settled_registration_ ABSL_GUARDED_BY(mu_) = false;
  // registrations_ when the stream of watch_context_ opened: one opened as
  // the newest registration is not cancelled "to reopen as the new one".
  int64_t watch_opened_as_ ABSL_GUARDED_BY(mu_) = 0;
  // The heartbeat thread cancelled the stream of watch_context_ to reopen
  // it as the new registration: that CANCELLED is not a failure. Reset as
  // each stream opens; a CANCELLED without it is the coordinator's.
  bool watch_cancelled_to_reopen_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<JobRunner> runner_ ABSL_GUARDED_BY(mu_);
  // The incarnation runner_ reports as (its stream's): a RUN of the same
  // plan on a newer incarnation's stream replaces it.
  int64_t runner_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  // Handle is between taking a RUN and setting runner_ to its runner (the
  // old one stopping meanwhile, runner_ empty): AwaitDrained must not take
  // that for "the job let this worker go" (a re-plan may keep a drained
  // worker until its next boundary).
  bool replacing_runner_ ABSL_GUARDED_BY(mu_) = false;
  // The job the coordinator's answer to RequestDrain said this worker is
  // ASSIGNED to while no runner of it had started (a plan being made, or
  // its RUN on the way): AwaitDrained waits for that job's RUN (then its
  // runner) or STOP, which clear it, instead of leaving at once, which the
  // job took for a lost worker (a recovery) rather than a drain.
  std::string assigned_job_ ABSL_GUARDED_BY(mu_);
  // The job of a runner being stopped (StopRunnerLocked), whose stop is
  // not done: heartbeats say so instead of "idle".
  std::string stopping_job_ ABSL_GUARDED_BY(mu_);
  // The job of the last assignment Handle took, RUN or STOP (see
  // InstructionAndLastJob); "" before any.
  std::string last_job_id_ ABSL_GUARDED_BY(mu_);
  // This worker's current NCCL id (empty: none), and whether an assignment
  // has carried it (then it is used up and a new one is made).
  std::string group_id_ ABSL_GUARDED_BY(mu_);
  bool group_id_used_ ABSL_GUARDED_BY(mu_) = false;
  bool group_id_unreported_ ABSL_GUARDED_BY(mu_) = false;  // made after registering
  // Started by Start() under mu_ unless stopping_ is set; Stop() sets
  // stopping_ under mu_ first, so it reads them race-free afterwards.
  std::thread heartbeat_thread_, watch_thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_WORKER_AGENT_H_
