// JobRunner: one assignment on one worker, on a thread of its own.
//
// Loads the job's corpus and reads the units the stage starts from (a
// checkpoint or spec.init.from: ReadUnits), connects the data plane, builds
// a StageRuntime and restores those units into it,
// waits at the start barrier until every stage of the job is ready (so no
// tensor reaches a worker that has not taken its assignment yet; a stage in
// a device group passes the barrier first and then joins the group, whose
// NCCL set-up waits for every member: Backend::JoinDeviceGroup; so does a
// stage whose replicas sum its gradients with NCCL: a replica device group,
// Backend::JoinDeviceCollective), then runs
// iterations start_iteration .. steps-1, reporting each to the
// coordinator; after the last one it uploads the stage's weights (when the
// job asks for a weights file) and reports finished. Any error is reported
// as the job's failure with the message of the failing instruction (marked
// peer_failure when it came from the data plane, or is the weights
// upload's UNAVAILABLE or DEADLINE_EXCEEDED past the retries, so that a job
// with checkpoints recovers). Stop()
// aborts receives at once (Mailbox::AbortJob, and the device group's
// channel and replica collective, unless every step has run), and sends
// too unless every step has run (Transport::Abort: a send to a stalled
// peer would wait up to a minute), cancels a weights upload in flight
// (CallCancel), and joins. A
// job that ends early (failed or stopped) aborts them before anything waits
// on the device, as its peers may never send what a queued receive or sum
// waits for.
//
// Checkpoints (spec.checkpoint): an assignment with `resume` first loads
// every unit the stage holds from that checkpoint (a file that is missing,
// corrupt or of another model is reported checkpoint_unusable). After each
// step that is a multiple of interval_steps (the last step excepted) the
// runner snapshots its backward units and a CheckpointWriter writes them
// under options.checkpoint_root while training goes on; the files are
// reported (ReportProgressRequest.checkpoint) once durable. A write
// refused because the stage's weights or moments are not finite (an AdamW
// second moment overflowed, the weights and the loss still finite) fails
// the job, FAILED_PRECONDITION "training diverged: ..." (not a peer
// failure), as train-local ends at that checkpoint: the runner reports it
// before its next step, or when it next waits for the writer, whichever
// comes first (after the last step, before the weights upload). It is not
// reported as the checkpoint's write error, which at a drain's or join's
// step boundary the coordinator recovers from.
#ifndef PIPETRAIN_WORKER_AGENT_JOB_RUNNER_H_
#define PIPETRAIN_WORKER_AGENT_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/annotated_mutex.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "worker/agent/backoff.h"
#include "worker/agent/call_cancel.h"
#include "worker/checkpoint/checkpoint_hold.h"
#include "worker/model/unit.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/data_plane_auth.h"
#include "worker/transport/mailbox.h"
#include "worker/transport/transport.h"

namespace pipetrain {

// What a runner needs from the coordinator. Thread-safe implementations.
class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  virtual absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request) = 0;
  // Sends every parameter's value as chunks; ends the upload. `cancel`
  // (may be null) cuts it short from another thread: CANCELLED.
  virtual absl::Status UploadWeights(const std::string& job_id,
                                     const std::vector<Parameter*>& params, CallCancel* cancel) = 0;
};

// Builds the stage's transport: (stage, peer data-plane addresses, the
// job's data-plane credential) -> Transport. Called only with one address
// per worker of the job (an assignment with another count fails the job
// with INVALID_ARGUMENT first), so `stage` indexes `peers`.
using TransportFactory = std::function<std::unique_ptr<Transport>(
    int stage, const std::vector<std::string>& peers, const JobCredential& credential)>;

struct JobRunnerOptions {
  std::string worker_id;
  int64_t incarnation = 0;
  absl::Duration recv_timeout = absl::Seconds(60);
  // Where the stages compute (not owned; outlives the runner).
  Backend* backend = CpuBackend();
  // Called once, on the runner's thread, when the job ended (after its
  // error was reported) with the backend failed (Backend::status() not OK).
  // A device error sticks and a CUDA context does not recover from most of
  // them, so no later job can run on this worker: the worker process should
  // stop and be restarted (worker/main.cc exits with code 4).
  std::function<void(const absl::Status&)> on_backend_failure;
  // Called once, on the runner's thread, right after completed() turned
  // true (the last step reported), holding none of the runner's locks. An
  // owner that waits on its own lock for completed() takes that lock here:
  // an absl::Mutex condition is re-checked only when the mutex is
  // released, and nothing else would release it when the job completes.
  std::function<void()> on_completed;
  // The worker's --data-root list: spec.data.path is read only from inside
  // these (common/confined_path.h ResolveUnderRoots). Empty: no data file
  // can be read (generated corpora still work).
  std::vector<std::string> data_roots;
  // The worker's --checkpoint-root: spec.checkpoint.dir is a name under it
  // (the coordinator's --output-dir, shared). Empty: a job with checkpoints
  // fails on this worker, saying so.
  std::string checkpoint_root;
  // Tests only (--test-hold-checkpoint, checkpoint_hold.h): the checkpoint
  // write to hold. Default: none.
  CheckpointHold checkpoint_hold;
  // The worker's memory limit (DeviceInfo.memory_limit_bytes: --memory-limit,
  // else the cgroup's limit or RAM). A data file may be at most a third of
  // it (a text corpus takes about three times its size while it loads); a
  // larger one fails the job with RESOURCE_EXHAUSTED naming the limit,
  // before anything is allocated. 0: no bound.
  int64_t memory_limit_bytes = 0;
  // How reports and the weights upload the coordinator could not take are
  // sent again (RetryWhileOutcomeUnknown): the first wait, doubled up to 8 times it, for at
  // most `report_retry_for` after the first failure. Tests shorten them.
  absl::Duration report_retry_backoff = absl::Milliseconds(500);
  absl::Duration report_retry_for = absl::Seconds(60);
  // The jitter of those waits and of the start barrier's polls (each scaled
  // by a factor in [1 - jitter, 1], backoff.h) and its seed, a fresh one per
  // options: the stages of a job report at the same step boundary and wait
  // at the same barrier, and unjittered they retried and polled in
  // lockstep, W calls at once. Tests that check exact waits set jitter 0.
  double retry_jitter = 0.5;
  uint64_t retry_seed = RandomBackoffSeed();
};

// The waits RetryWhileOutcomeUnknown makes for `options`:
// report_retry_backoff, doubled up to 8 times it, each jittered by
// retry_jitter with retry_seed. Thread-safe.
BackoffOptions ReportRetryBackoff(const JobRunnerOptions& options);

// The start barrier's wait before its poll number `poll`, `waited` after
// its first: the longer of 20 ms and a tenth of `waited`, at most 1 s,
// scaled by BackoffJitterFactor(seed, poll, jitter). A stage that comes
// after a short gap is seen within about a tenth of it, and the stages of
// a job that wait minutes for a slow one each poll about once a second,
// spread apart: every poll is a report the coordinator answers under its
// job lock, and 20 ms apart on W workers they flooded it. Deterministic
// for its arguments. Thread-safe.
absl::Duration StartBarrierPollDelay(absl::Duration waited, uint64_t seed, uint32_t poll,
                                     double jitter);

// JobRunnerOptions::report_retry_for for a worker whose coordinator gave it
// `lease` (RegisterWorkerResponse.lease_seconds) and `heartbeat_interval`:
// 60 s, or the lease and one heartbeat when longer, at most a day. An
// operator raises --lease-seconds to ride out longer outages; a stage
// that gave up its reports after 60 s ended the step for the job (one
// without checkpoints failed) while its lease still held.
absl::Duration ReportRetryForLease(absl::Duration lease, absl::Duration heartbeat_interval);

// The job's name on the data plane for one plan version ("job-1/2"): a
// re-planned job is another data-plane job, so no frame of the old plan
// can reach the new one (Mailbox::OpenJob).
// (common/data_plane_keys.h DataPlaneJobId).
std::string DataPlaneJobId(const v1::Assignment& assignment);

// How many workers the job has: replicas x stages x tensor ranks (an unset
// replicas or tensor_parallel counts 1). Requires a layout
// CheckAssignmentLayout accepted (unchecked factors can overflow).
int AssignmentWorkerCount(const v1::Assignment& assignment);

// `status` as a progress report's error (ReportProgressRequest.error,
// CheckpointWritten.error): its text, made valid UTF-8 (other bytes
// escaped) and cut to 4096 bytes on a character boundary (" [...]" then
// follows), so that the coordinator can parse the report.
std::string ReportableError(const absl::Status& status);

// This worker's index among the job's workers (replica, stage, tensor rank
// innermost; plan.proto's peer_addresses order): its transport's stage,
// its device group member and its data-plane key index. Requires a layout
// CheckAssignmentLayout accepted.
int GlobalWorkerIndex(const v1::Assignment& assignment);

// OK when the assignment's layout is one a worker can run: num_stages in
// 1..kMaxStages, replicas in 0..kMaxStages and tensor_parallel in
// 0..kMaxTensorParallel (0: unset, meaning 1; spec/job_spec.h), each
// checked on its own before they are multiplied, their product at most
// kMaxStages workers (as for a spec), stage, replica and tensor_rank within
// them, and one peer address per worker. Otherwise INVALID_ARGUMENT
// "assignment: ..." naming the field. The worker checks it before it sizes
// the data plane or the mailbox from the assignment (WorkerAgent) and
// before a runner builds anything (JobRunner, which reports it as the
// job's error). Thread-safe.
absl::Status CheckAssignmentLayout(const v1::Assignment& assignment);

// OK when the assignment carries this worker's data-plane keys
// (plan.proto: a receive key and one send key per worker, each
// kDataPlaneKeyBytes); FAILED_PRECONDITION otherwise, "no data-plane
// keys" when it has none (a coordinator older than this worker): without
// them the stage's data plane would take frames from anyone. Requires a
// layout CheckAssignmentLayout accepted. Checked, after the layout, by the
// agent (which then opens nothing) and by the runner (which reports it as
// the job's error). Thread-safe.
absl::Status CheckDataPlaneKeys(const v1::Assignment& assignment);

// OK when `steps` (the job's spec.training.steps) is in [1, kMaxSteps],
// the assignment's start_iteration is in [0, steps) and, with a resume,
// equals resume.step (plan.proto: the checkpoint holds that many steps).
// Otherwise INVALID_ARGUMENT "assignment: ..." naming the fields. Checked, as the
// layout, before the mailbox is opened at start_iteration (its run-ahead
// window adds to it) and before a runner runs. Thread-safe.
absl::Status CheckStartIteration(const v1::Assignment& assignment, int64_t steps);

// Per-iteration observations for metrics (called on the runner thread).
using IterationObserver = std::function<void(const IterationResult&)>;

class JobRunner {
 public:
  JobRunner(v1::Assignment assignment, Mailbox* mailbox, TransportFactory make_transport,
            CoordinatorLink* coordinator, JobRunnerOptions options,
            IterationObserver observer = nullptr);
  ~JobRunner();  // Stop()

  void Start();
  void Stop();
  bool finished() const { return finished_.load(); }
  // Every step ran and was reported (not stopped, failed or parked at a
  // step boundary).
  bool completed() const { return completed_.load(); }
  const v1::Assignment& assignment() const { return assignment_; }
  // For heartbeats: "starting" until the stage runs, then its current
  // instruction, "ending: ..." while the runner closes its links and
  // reports (retrying for an unreachable coordinator), "idle" once done.
  std::string current_instruction() const;

 private:
  void Run();
  absl::Status RunJob();
  // The start barrier waits the longer of recv_timeout and this (the
  // stages' data and checkpoint loads come before it).
  static constexpr absl::Duration kMinStartBarrierWait = absl::Minutes(10);
  absl::Status AwaitAllStagesReady();
  // The assignment's device group's channel, from the backend
  // (Backend::JoinDeviceGroup); its error prefixed with the group.
  absl::StatusOr<std::unique_ptr<DeviceChannel>> JoinDeviceGroup();
  // The assignment's replica device group's collective, from the backend
  // (Backend::JoinDeviceCollective); INVALID_ARGUMENT unless the group
  // lists every replica in order; errors prefixed with the group.
  absl::StatusOr<std::unique_ptr<DeviceCollective>> JoinReplicaGroup();
  // Reports the job's failure; `checkpoint_unusable` as in
  // ReportProgressRequest, peer_failure when the device failed or
  // IsPeerFailure(status) (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED), the
  // weights upload's failure included.
  void ReportError(const absl::Status& status, bool checkpoint_unusable = false);
  // A stage's units as read and decoded from a checkpoint or from
  // spec.init.from, not yet restored into a runtime. Read before the start
  // barrier (a device or replica group member's too, which joins its group
  // after it), restored once the runtime exists: every stage's load then
  // comes before the barrier, whose wait is long enough for it.
  struct ReadUnits {
    std::vector<UnitState> states;
    int64_t optimizer_steps = 0;
    std::string source;  // the checkpoint's dir or the file's path, for the log
  };
  // Reads Assignment.resume's files for every unit the stage holds (see
  // the file comment); needs no runtime. CANCELLED after a stop.
  absl::StatusOr<ReadUnits> ReadResume(const CheckpointIdentity& identity);
  // Restores what ReadResume read; Restore's refusals (states that do not
  // fit this stage) as DATA_LOSS, the checkpoint's fault.
  absl::Status RestoreResume(StageRuntime& runtime, const ReadUnits& read);
  // OK when options_.checkpoint_root opens as a directory; UNAVAILABLE
  // (this worker's trouble, not the checkpoint's) or FAILED_PRECONDITION
  // when none was given.
  absl::Status CheckCheckpointRootReachable() const;
  // Reads Assignment.init_weights (spec.init.from, a safetensors file):
  // this stage's tensors alone, fitted and checked finite (INVALID_ARGUMENT
  // otherwise); StageRuntime::Restore checks their shapes.
  absl::StatusOr<ReadUnits> ReadInitWeights(const GptConfig& model);
  // Reports a checkpoint's write (on the writer's thread); one refused
  // because the stage's state is not finite (IsSnapshotNotFinite) is not
  // reported but sets checkpoint_diverged_, which fails the job.
  void ReportCheckpoint(int64_t step, double seconds,
                        const absl::StatusOr<std::vector<v1::UnitFile>>& files);
  // checkpoint_diverged_, read under mu_.
  absl::Status CheckpointDiverged() const;
  // A report (an iteration's, a checkpoint's, the start barrier's or a
  // failure's), sent again after UNAVAILABLE or DEADLINE_EXCEEDED (a
  // coordinator restarting, a leader change, a lost answer) until
  // options_.report_retry_for (60 s, or the lease: ReportRetryForLease)
  // has passed since the first failure,
  // about 0.5 s, 1 s, 2 s and then 4 s apart (jittered: ReportRetryBackoff),
  // unless the runner stops: an outage must not end a
  // stage whose data plane is fine, nor leave a step boundary waiting for a
  // checkpoint report that never came (the coordinator re-plans only once
  // it has it, so a stage that gave up after a few seconds left the job
  // RUNNING with every stage idle; ReportCheckpoint sends the boundary's
  // again until answered), nor lose a failure no peer would
  // report. A coordinator gone for longer has let this worker's lease
  // lapse meanwhile, and answers with an error that is not retried. Each
  // report is idempotent at the coordinator: an iteration's is counted
  // once (a retry of one it had applied is answered without applying it
  // again), a checkpoint's unit files again are the same entries, and
  // readiness or a failure said twice is said once.
  absl::StatusOr<v1::ReportProgressResponse> ReportWithRetries(const v1::ReportProgressRequest& r);
  // The final weights' upload, sent again whole as reports are (the same
  // waits, for as long, not after a stop): a coordinator unreachable for a
  // while (UNAVAILABLE, no answer) may have none of the stream, and one
  // that lost only the answer takes the same chunks twice (each chunk
  // rewrites its own range; the job completes only after this stage's
  // final report, which follows the upload). A coordinator that restarted
  // or lost its leadership meanwhile refuses this worker's old session
  // (UNAUTHENTICATED, not retried): its job resumes from its last
  // checkpoint instead. RunJob fails the job with an upload still failing
  // past the retries, "uploading the final weights to the coordinator:
  // ...", a peer failure when UNAVAILABLE or DEADLINE_EXCEEDED: a job with
  // checkpoints recovers and uploads again (a coordinator's shortage of
  // descriptors or memory passes).
  absl::Status UploadWeightsWithRetries(const std::vector<Parameter*>& params);
  // Calls `attempt` until it returns OK or an error whose outcome is known
  // (OutcomeUnknown: UNAVAILABLE, DEADLINE_EXCEEDED), the runner stops, or
  // the next wait would end past options_.report_retry_for since the first
  // call failed (not since it began: an upload of a large stage may run for
  // minutes, and one broken after 60 s was never sent again, failing a job
  // that had trained every step); `what` names the call in the warnings.
  // Returns the last result.
  absl::Status RetryWhileOutcomeUnknown(const std::string& what,
                                        const std::function<absl::Status()>& attempt);
  // Sleeps `wait`, in slices, so that a stop is not held up by it.
  void SleepUnlessStopped(absl::Duration wait) const;

  v1::Assignment assignment_;
  Mailbox* mailbox_;
  TransportFactory make_transport_;
  CoordinatorLink* coordinator_;
  JobRunnerOptions options_;
  IterationObserver observer_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  // The stage's computation is over (done, failed or stopped): the runner
  // tears down its links and reports, which may take a while.
  std::atomic<bool> ending_{false};
  std::atomic<bool> completed_{false};  // every step ran and was reported
  // The step boundary the coordinator asked for (stop_after_step), once
  // known; 0 before. Its checkpoint's report is sent until answered.
  std::atomic<int64_t> boundary_step_{0};
  // The coordinator refused this worker's session (UNAUTHENTICATED: it
  // restarted, or a newer incarnation registered): an error report would be
  // refused alike, and the agent registers again, so the stage stops quietly.
  std::atomic<bool> session_refused_{false};
  CallCancel upload_cancel_;            // the weights upload's, cancelled by Stop()
  bool reported_ = false;  // the failure went to the coordinator (runner thread only)
  const std::string data_plane_job_;
  double resume_load_seconds_ = 0;  // runner thread only
  std::string data_sha256_;         // CorpusSha256 of the loaded tokens; runner thread only
  mutable AnnotatedMutex mu_;
  StageRuntime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;  // while running
  // The device group's channel while the job holds one: Stop() aborts it,
  // since the job thread may be waiting on the device for a dead peer.
  DeviceChannel* device_channel_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The same for the replica device group's collective.
  DeviceCollective* replica_collective_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The data plane's transport while the job holds one: Stop() aborts it.
  Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  // OK, or the job's error ("training diverged: ...") once the writer
  // refused a checkpoint because the stage's state is not finite
  // (IsSnapshotNotFinite); set by ReportCheckpoint, reported by RunJob.
  absl::Status checkpoint_diverged_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_JOB_RUNNER_H_
