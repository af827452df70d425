// JobManager: the life of a job, from submission to trained weights.
//
//                ┌─ first plan: a worker lost, or ──┐  ┌─ step boundary ─────┐
//                ▲  refused for memory (once)       │  ▼  (a join, a drain)  │
//   Submit ──> QUEUED ──(enough READY workers)──> PLANNING ──(plan in)──> RUNNING ──> SUCCEEDED
//               │ ▲                  a worker lost  │  ▲                     │ a worker lost
//               ▼ │               while re-planned  │  │ re-plan             │ or failed, with
//            PROFILING                              ▼  │                     │ checkpoints
//      (no cached profile; any solver)           RECOVERING ◄────────────────┘
//
//   FAILED    <── any state not ended, for an error: a worker's, a plan refused, a queue
//                 timeout, a worker lost without checkpoints, too many recoveries
//   CANCELLED <── any state not ended, by Cancel
//   SUCCEEDED: every stage finished, and the weights file is written
//
// A restart (Restore) puts a job PROFILING or first PLANNING back to
// QUEUED, and one later PLANNING, RUNNING or RECOVERING to RECOVERING
// (FAILED without checkpoints). With options.state, an end is shown as a
// failover would restore the job until a save of it succeeds
// (ShowUnsavedEndLocked): a success RUNNING "finishing: ...", a failure
// RUNNING "ending: ..." (QUEUED for a job never planned); a cancel
// CANCELLED, Cancel answering UNAVAILABLE.
//
// Scheduling: QUEUED jobs are placed oldest first, but a job that cannot be
// placed yet lets later jobs that fit go ahead (past half its queue timeout
// it keeps the READY workers it can use: see ScheduleQueued); one that
// waits longer than its spec.scheduling.queue_timeout FAILS.
// Planning runs off the job manager's lock (options.background_runner; by
// default one background thread, a task at a time), so a large plan
// (seconds, planner.h's budget) holds up no other job's reports or the API,
// and neither does syncing a finished job's weights file. A plan's workers
// are assigned to the job in the registry when planning begins (PLANNING),
// so no other job takes them meanwhile; a worker lost while the job is
// planned sends a first plan back to QUEUED and a re-plan back to
// RECOVERING (without it), instead of failing the job when the plan is in.
// Planning takes the first `stages` READY workers (ascending id); when that
// first plan is refused for memory and other READY workers have more, the
// job goes back to QUEUED once to be placed on the workers with the most
// memory (RoomiestWorkers), and FAILS only if that plan is refused too. It splits the
// model with the job's solver (planner.h) on a profile of the model,
// compiles one program per stage and publishes an Assignment per worker to
// the AssignmentHub. The profile is the measured one cached for (model,
// device kind of the first chosen worker) when there is one; otherwise,
// with a profile fetcher set (every solver), the job goes QUEUED ->
// PROFILING while the first chosen worker profiles the model
// (WorkerControl.Profile, outside the lock), and back to QUEUED to be
// planned with it; without a fetcher, or when the fetch failed, it is the
// AnalyticProfile at the workers' measured GEMM rate, and the plan's
// profile_source says so. Worker speeds are their
// measured GFLOP/s relative to the profiled (or fastest) worker; links are
// modelled as options.network declares them, at kAssumedBandwidth and
// kAssumedLatency when it does not (the network is not measured), or as the
// workers emulate them, plus the data plane's own
// cost per message that the workers measured (data_plane_cost.h).
// Stages whose workers share a hostname, hold distinct GPUs and reported an
// NCCL unique id get a device group (device_links.h): the raw activation
// transfers between them go LINK_PATH_DEVICE where send and receive orders
// agree, Assignment.device_group carries the group to its members, and the
// id each group uses is consumed in the registry (the worker reports a fresh
// one by heartbeat). With data parallelism, each replica's stages are
// grouped so too, and the replicas of an exactly all-reduced stage that
// share a host and hold distinct GPUs with ids get a replica device group
// (replica_device_groups.h; Assignment.replica_device_group): they sum
// their gradients with NCCL, with a member's id no device group took,
// consumed the same way. Progress comes from
// ReportProgress: the stage owning
// the head reports micro-batch losses, whose mean (double sum / m, as
// LocalTrainer computes it) is the step's loss. After its last step each
// stage uploads its weights, then reports finished, each chunk written straight into
// one safetensors file (HF GPT-2 names; a temporary until complete, so the
// coordinator holds none of it in memory); once every element of every
// tensor is in, the file is synced and renamed into place and the job
// SUCCEEDED. A lost worker fails its job with a reason naming it; the other
// workers get a STOP assignment and return to READY.
//
// Checkpoints and recovery (spec.checkpoint, DESIGN.md §11): stages report
// the unit files they wrote after every interval_steps steps; once every
// unit of a step is in, the checkpoint is complete (CheckpointCatalog), its
// manifest is written under --output-dir and the oldest beyond `keep` are
// removed. When a job with checkpoints loses a worker (the registry's loss
// listener, or a stage reporting a data-plane failure: peer_failure), it
// goes RECOVERING instead of FAILED: every stage is stopped and released;
// the job waits until each of its former workers has either heartbeated
// since (alive) or been declared LOST, then re-plans with its solver on
// the READY workers (its survivors first, then spares; between
// spec.elastic.min_workers and max_workers of them), plan version + 1, and
// resumes every stage from the latest complete checkpoint (from step 0 when
// there is none yet). The loss history is cut back to that step: the steps
// after it are redone with the same data, so they repeat the lost ones'
// losses bitwise. A stage that cannot load the checkpoint
// (checkpoint_unusable, taken only from a stage loading its plan's resume
// point, before its first iteration) makes the job drop it and resume from the one
// before. A worker new to the plan (not in the one before it) whose stage
// fails before the start barrier for a reason of its own (not a peer's,
// not the checkpoint's) is left out: the job recovers without it, and
// does not take it again until it registers anew. kMaxRecoveriesWithoutProgress recoveries in a row
// without a checkpoint beyond every earlier one fail the job. Workers a recovering job waits for
// are not given to other jobs.
//
// Step boundaries (joins and drains): a RUNNING job with checkpoints that
// has fewer stages than spec.elastic.max_workers grows when a READY worker
// is spare and no QUEUED job can run on it (a queued job holds the spares
// it can run on; no job may be PROFILING or PLANNING, and no RECOVERING
// one able to use it); Drain(worker) takes a worker out of its
// job. Either way the job picks a step t beyond every stage's progress
// (ReportProgressResponse.stop_after_step); each stage checkpoints after
// step t and stops; once that checkpoint is complete the job re-plans on
// its workers (less the drained, plus spares no queued job can run on, up
// to max_workers) and
// resumes at t, redoing nothing. A drained worker gets no job until its
// process restarts (heartbeats tell it that it is drained, and it says so
// when it registers again, e.g. after a coordinator restart).
//
// Thread-safe. Lock order: JobManager before WorkerRegistry before
// AssignmentHub (the registry's loss listener is called outside its lock).
#ifndef PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_H_
#define PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/confined_path.h"
#include "common/data_plane_keys.h"
#include "common/job_state.h"
#include "common/link_model.h"
#include "common/safetensors.h"
#include "common/serial_executor.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/checkpoint_catalog.h"
#include "coordinator/jobs/covered_ranges.h"
#include "coordinator/jobs/memory_budget.h"
#include "coordinator/jobs/profile_cache.h"
#include "coordinator/jobs/recovery_kind.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/profile.h"
#include "coordinator/registry/worker_registry.h"
#include "coordinator/store/coordinator_state.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "spec/job_spec.h"

namespace pipetrain {

// Asks the worker whose data plane is at `data_address` to profile a model,
// presenting an HMAC of the worker's `session_token` (WorkerRegistry::
// SessionToken; WorkerControlCredential, common/secrets.h), which its
// WorkerControlService requires; the token itself is not sent.
using ProfileFetcher = std::function<absl::StatusOr<v1::ModelProfile>(
    const std::string& data_address, const std::string& session_token,
    const v1::ProfileRequest& request)>;

// Steps of loss history a job keeps (JobProgress.loss_history).
inline constexpr int kMaxLossHistory = 10000;

// A job that recovers this many times in a row without completing a new
// checkpoint FAILS (something fails deterministically, or keeps failing).
inline constexpr int kMaxRecoveriesWithoutProgress = 3;
// The most expired checkpoints a job's stored record lists for removal
// after a restart (store::StoredJob.expiring; about 40 bytes each).
inline constexpr size_t kMaxStoredExpiring = 64;
// The removal of an expired checkpoint's directory that fails is tried
// again by the scheduling pass (RetryExpiringLocked, for ended jobs too),
// kExpiredRemovalBackoff apart, until it has failed this many times and
// for this long since its first failure in this process, then given up,
// logged for the operator: a file system's passing error (an NFS failover)
// passes, a lasting one (a link put there, files the coordinator may not
// remove) is not tried for ever. Not at each save: a running job saves
// every second, and each try logs.
inline constexpr int kMaxExpiredRemovalTries = 3;
inline constexpr absl::Duration kExpiredRemovalRetryFor = absl::Hours(1);
// The wait after a checkpoint's first, second, and third and later failed
// removals: tries 0, 1, 6, 21, 36, 51 and 66 minutes after the first
// failure, given up at the last.
inline constexpr absl::Duration kExpiredRemovalBackoff[] = {absl::Minutes(1), absl::Minutes(5),
                                                            absl::Minutes(15)};
// The most bytes of a stored recovery cause (store::StoredJob.
// recovery_reason) a restart keeps in the job's reason.
inline constexpr size_t kMaxStoredRecoveryReason = 2048;
// The longest SubmitJobRequest.request_id: a UUID (36) with room to spare.
inline constexpr size_t kMaxRequestIdBytes = 128;
// The longest job or worker id a call may name (GetJob, CancelJob, GetPlan,
// DrainWorker and their REST paths). The ids this coordinator makes
// ("job-<epoch>-<n>", "w-<n>") are far shorter; a longer one is
// INVALID_ARGUMENT before any lookup, and errors quote at most 64 bytes of it.
inline constexpr size_t kMaxIdBytes = 128;
// INVALID_ARGUMENT naming `field` when `id` is empty or longer than kMaxIdBytes.
absl::Status CheckIdArgument(absl::string_view field, absl::string_view id);
// Profiles a job tries on workers that leave during them (JobManager::
// FinishProfiling) before it plans on the analytic profile.
inline constexpr int kMaxProfileAttempts = 3;
// How long a profile that ran past the fetch's deadline keeps later jobs
// of the same model, device and build from profiling it (they plan on the
// analytic profile), and how many such keys are remembered.
inline constexpr absl::Duration kProfileTimeoutMemory = absl::Hours(1);
inline constexpr size_t kMaxProfileTimeouts = 64;

// How long after a job ended its checkpoint directory's second sweep waits
// at most for the job's workers to report that they stopped: a worker
// stops within its --stop-timeout-seconds (20 s by default) or exits, and
// is LOST after its lease.
inline constexpr absl::Duration kLateSweepWait = absl::Seconds(60);
// Plan versions kept in Job.plan_history (the newest), and at most
// kMaxPlanHistoryBytes of them (older ones go first, the newest always
// stays): the job's stored record must stay within the state store's value
// limit (1 MiB) and every ListJobs page carries the history, while a
// 1024-worker job's entry lists 1024 worker ids. An entry's reason (which
// quotes a worker's error, up to 16 KiB) keeps its first
// kMaxPlanReasonBytes; the coordinator's log has it whole.
inline constexpr int kMaxPlanHistory = 100;
inline constexpr int64_t kMaxPlanHistoryBytes = int64_t{128} << 10;
inline constexpr size_t kMaxPlanReasonBytes = 2048;
// Drops `history`'s oldest entries while it holds more than kMaxPlanHistory
// or (keeping the newest one whatever its size) more than
// kMaxPlanHistoryBytes.
void TrimPlanHistory(google::protobuf::RepeatedPtrField<v1::PlanVersion>& history);
// Separate covered ranges a tensor's uploaded chunks may form (a stage's
// come in order: one); a chunk that would add one more is refused. The
// memory bound is the job's: its tensors' ranges summed, at most one a
// tensor and kMaxWeightsRuns more (chunks are taken at any step while the
// job runs, and a worker scattering 1-value chunks over every tensor of a
// large model held about 2M ranges, 140 MB, under the per-tensor cap).
inline constexpr int kMaxWeightsRuns = 1024;

// What the job manager tells the coordinator's metrics (all optional; called
// under the job manager's lock: they must not call back into it).
struct JobEvents {
  // A job went RECOVERING, for `kind` (recovery_kind.h).
  std::function<void(RecoveryKind kind)> recovery_started;
  // A recovered job completed its first step on the new plan: seconds since
  // the loss was detected, split into waiting for the survivors, planning,
  // and from the new assignments to that first step (loading included).
  std::function<void(double total, double waiting, double planning, double restart)> recovered;
  std::function<void(int64_t steps)> steps_redone;
  // A stage wrote its files of a checkpoint in `seconds`.
  std::function<void(double seconds)> checkpoint_written;
  // A checkpoint completed (every unit in): its bytes.
  std::function<void(int64_t bytes)> checkpoint_completed;
  std::function<void()> checkpoint_failed;  // a stage could not write its files
  // A job ended (SUCCEEDED, FAILED or CANCELLED), once per job; also a
  // job Restore fails (for want of checkpoints, say). A success or a
  // failure with options.state (every one Restore fails) counts once its
  // end is saved (on io_, as it leaves end_unsaved_): until then it is
  // shown RUNNING (or QUEUED), and a failover restores it as last saved and
  // runs it again. A cancel counts at once.
  std::function<void(v1::JobState state)> ended;
  // A placement's plan was taken (sent, or its refusal acted on): seconds
  // it waited for the planning thread, and seconds it computed. Not for a
  // plan skipped or dropped because its job moved on (cancelled, a worker
  // lost) or the manager is shutting down.
  std::function<void(double queued, double computing)> planned;
  // Restore loaded a job from the store at progress step `step`: steps an
  // earlier process trained (and counted). Once per restored job.
  std::function<void(const std::string& job_id, int64_t step)> restored;
  // A save of a job's state to JobManagerOptions.state failed (a full
  // disk, an unreachable etcd): a submit's, or one that is tried again
  // every second until it succeeds. Called off the lock (on the thread
  // that saved), unlike the others.
  std::function<void()> state_save_failed;
  // A delete of a job's state from JobManagerOptions.state failed: a
  // pruned job's, or a failed submit's (which the store may hold after
  // all), each tried again every second until it succeeds. Called off the
  // lock, as state_save_failed.
  std::function<void()> state_delete_failed;
};

inline constexpr double kAssumedBandwidth = 1.25e9;  // bytes/s (10 Gbit/s)
inline constexpr double kAssumedLatency = 50e-6;     // seconds

struct JobManagerOptions {
  // The coordinator's --output-dir: spec.output.weights_path is a name
  // under it (common/confined_path.h). Empty: a job asking for a file is
  // refused at submit (INVALID_ARGUMENT naming the field).
  std::string output_dir;
  // The coordinator's --data-root list: when set, spec.data.path must name
  // a readable file under one of them at submit (the workers check their
  // own roots again when they load it). Empty: workers alone check.
  std::vector<std::string> data_roots;
  // Job ids are "job-<id_epoch>-<n>" ("job-<n>" when empty). The coordinator
  // sets a fresh epoch per start, so ids never repeat across restarts.
  std::string id_epoch;
  // At most this many jobs not yet ended (QUEUED ... RUNNING); Submit
  // beyond it is RESOURCE_EXHAUSTED.
  int max_pending_jobs = 256;
  // Ended jobs are kept (Get, List) at most this long after they ended, and
  // at most this many (those that ended longest ago are pruned first,
  // whenever they were submitted).
  absl::Duration ended_job_retention = absl::Hours(24);
  int max_ended_jobs = 1000;
  // Of the ended jobs that were planned, the latest this many to end keep
  // their plan's drawings (timelines, traces: megabytes for many
  // micro-batches) and what the measured timeline is drawn from (the
  // workers' programs and traced steps, megabytes too); those that ended
  // earlier keep the plan without them, as a restored job's (the store
  // never holds them).
  int max_ended_jobs_with_drawings = 16;
  // The coordinator's --network: the links between workers that jobs are
  // planned over. Unset: kAssumedBandwidth and kAssumedLatency, and plans
  // say the network was assumed. Workers that emulate their links
  // (--emulate-link) are planned over those instead (their sends are paced
  // so).
  std::optional<LinkModel> network;
  // The coordinator's --gpu-memory-reserve (memory_budget.h), in [0,
  // kMaxGpuMemoryReserveBytes]: GPU memory kept out of each GPU worker's
  // plan (PlanMemoryBudgets), once per worker (what it is for is each
  // process's own).
  int64_t gpu_memory_reserve_bytes = kDefaultGpuMemoryReserveBytes;
  // Durable state (not owned; null: in memory only). Submit returns only
  // once the job is saved; every state change, plan, complete checkpoint
  // and, at most once a second, progress is saved too. Restore() reads it
  // back after a restart.
  CoordinatorState* state = nullptr;
  // After a restart, how long a restored running job waits for its former
  // workers to register again before it re-plans without them, and a
  // restored queued job before its queue timeout may fail it.
  absl::Duration restart_grace = absl::Seconds(15);
  // How long Cancel waits for the store to record the cancel (behind the
  // other file and store work queued before it) before it answers
  // UNAVAILABLE "not yet recorded": within a client's default deadline
  // (the CLI's --timeout, 10 s), so that a backlog holds neither the
  // client nor the gRPC thread that submits, cancels and drains share.
  absl::Duration cancel_save_wait = absl::Seconds(8);
  // Judges how long things have taken (only differences of its readings
  // count): queue and recovery timeouts, the restart grace, step and
  // recovery times. The coordinator gives MonotonicClock(), so that a step
  // of the wall clock (NTP, a resumed laptop) neither fails every waiting
  // job at once nor lets one wait for ever. The manager's `clock` still
  // dates what it shows (create and update times, plan history). nullptr:
  // `clock` (a test's FakeClock moves both).
  Clock* elapsed_clock = nullptr;
  // Where the long work runs, off the job manager's lock: a placement's
  // planning (the solver, the layout search, the compiler) and a finished
  // job's weights file sync. It is called under that lock, so it must only
  // hand `task` on, never run it in place; every task handed on must run
  // (or be destroyed unrun) before the manager is. Null: two threads of the
  // manager's own, each a task at a time, in order: one plans, the other
  // syncs weights files (so that no plan waits behind an fsync of
  // gigabytes). Tests set it to interleave events with that work.
  std::function<void(std::function<void()> task)> background_runner;
  // Tests: called off the job manager's lock just before a job's weights
  // file is created (by the upload that creates it).
  std::function<void()> before_weights_file_created;
  // Tests: called off the job manager's lock just before a finished job's
  // weights file is synced (FinishWritingWeights).
  std::function<void()> before_weights_synced;
  // Tests: called with a job's id, under the job manager's lock (it must
  // not call the manager), when its Submit, saved, starts to wait for an
  // older submit still being saved before it lists the job.
  std::function<void(const std::string& job_id)> before_submit_waits;
  // The bytes free to this process on the file system of the directory
  // `dir_fd` (open), at submit; nullopt when unknown. Null: fstatvfs.
  // Tests set it to stand in for a full disk.
  std::function<std::optional<double>(int dir_fd)> free_bytes_for_testing;
};
class JobManager {
 public:
  JobManager(WorkerRegistry* registry, AssignmentHub* hub, Clock* clock,
             JobManagerOptions options = {});
  ~JobManager();  // stops the scheduling loop, cancels and waits for profiles in flight

  // Enables measured profiles (see above). Call before submitting jobs.
  // `cancel_all`, if given, ends the fetches in flight at destruction, which
  // otherwise waits for them (a large model's profile takes minutes).
  // `cancel_to`, if given, ends the fetches in flight to one data address:
  // a scheduling pass calls it for a profiling worker the registry lost or
  // saw leave, whose call would otherwise wait out its deadline (a host
  // that vanished closes no connection), every later job waiting with it.
  void SetProfileFetcher(ProfileFetcher fetcher, std::function<void()> cancel_all = nullptr,
                         std::function<void(const std::string& data_address)> cancel_to = nullptr);
  // Enables the events above. Call before Restore (it reports the jobs it
  // resumes) and before submitting jobs.
  void SetEvents(JobEvents events);
  // Takes back the jobs and profiles of options.state (a restart): ended
  // and queued jobs as they were; a job that was running resumes from its
  // last complete checkpoint once its workers have registered again (or
  // options.restart_grace has passed), through RECOVERING; one without
  // checkpoints FAILS, saying the coordinator restarted. Call once, before
  // serving and before the scheduling loop. DATA_LOSS when the state does
  // not parse. FAILED_PRECONDITION, with nothing restored or saved, when a
  // job that has not ended holds a spec field or profile key this build
  // does not know (StoredFieldOfANewerBuild: a newer coordinator stored it).
  absl::Status Restore();
  const ProfileCache& profiles() const { return profiles_; }
  // Waits until every profile fetch started so far has been handled (the
  // job re-queued and scheduled). For tests and shutdown.
  void AwaitProfiling();
  // Waits until no placement is being planned and no weights file written
  // (plans in or dropped, jobs ended). With a background_runner, its tasks
  // must run meanwhile. For tests.
  void AwaitBackgroundWork();

  // `request_id` (SubmitJobRequest.request_id, coordinator.proto; "" for
  // none): a Submit repeating that of a job in jobs_ returns that job (same
  // spec) or ALREADY_EXISTS (another), before the spec is checked again;
  // UNAVAILABLE while that job is still being saved. INVALID_ARGUMENT when
  // it is longer than kMaxRequestIdBytes or has other characters than
  // A-Z a-z 0-9 . _ : -.
  // INVALID_ARGUMENT (from ResolveJobSpec, or a path the options do not
  // allow) naming the field; RESOURCE_EXHAUSTED when planning it would
  // exceed the planning budget (planner.h CheckPlanningBudget) or when
  // max_pending_jobs are pending. The job is QUEUED and starts as soon as enough workers are
  // READY. With options.state it returns once the store has the job
  // (UNAVAILABLE, nothing submitted, when the save fails); the save runs
  // off the job lock, so other calls go on meanwhile, and the job's
  // weights path and checkpoint directory are claimed from before it.
  // Submits save in parallel (REST's handler threads, beside gRPC's), but
  // one whose save ends first is listed, and returns, only once every
  // older submit (by creation time) is listed or has failed (a wait as
  // long as that save, which the store bounds): the list then only grows
  // at its end, so a page token, which resumes after the last job its
  // page returned (page_cursor.h), never passes a job listed later. The
  // cost: a stalled store commit (an etcd call up to its timeout) holds
  // every younger REST submit, and their handler threads, that long; a
  // client whose deadline is shorter sees DEADLINE_EXCEEDED for a job that
  // was saved (a retry with the same request id finds it).
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& request_id = "");
  // NOT_FOUND for an unknown id. progress.loss_history holds at most the
  // last kMaxLossHistory steps (progress.loss_history_start says where
  // they begin). A job that SUCCEEDED or FAILED is shown RUNNING (QUEUED
  // if it was never planned) until a save of that end succeeds (in flight,
  // hung or failing: ShowUnsavedEndLocked), here, in List, Summaries,
  // CountByState and a repeated Submit.
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  // Every job kept, in submission order, without progress.loss_history:
  // whole copies, for tests and the restore fuzzer (the API's pages and
  // /metrics read Summaries and copy only what they return).
  std::vector<v1::Job> List() const;
  // What /metrics and list pages read of every job kept, in submission
  // order: a few numbers each, so that a scrape (unauthenticated, at any
  // rate) or a page holds the jobs' lock only briefly and copies no spec,
  // plan history or checkpoint list.
  struct JobSummary {
    std::string id;
    int64_t create_time_nanos = 0;  // its order key (ListJobs pages)
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    int64_t step = 0;
    float loss = 0;
    float val_loss = 0;
    double tokens_per_step = 0;  // spec.training.batch_size x seq_len
    // Checkpoint writes failed since its last complete checkpoint
    // (progress.checkpoint_failures).
    int64_t checkpoint_failures = 0;
    // The step it started from: a job begun from a checkpoint
    // (spec.init.from) shows that step from its submission on, none of it
    // trained by this job.
    int64_t init_step = 0;
    // While it is RUNNING, how long since its last step completed or, if
    // none has since, its current plan started or a chunk of its final
    // weights came (the elapsed clock, at the call; zero while the complete
    // weights file is synced): what PipetrainJobStalled reads. A drain's or join's boundary
    // re-plans without leaving RUNNING for longer than the plan takes, so
    // the state alone cannot tell its checkpoint load from a stall. Zero in
    // any other state, and for an end shown RUNNING until it is saved
    // (its steps are over).
    absl::Duration without_step = absl::ZeroDuration();
  };
  std::vector<JobSummary> Summaries() const;
  // Answers once the state store has the cancel, with the job in the basic
  // view (no progress.loss_history, as List). A cancel of a CANCELLED job
  // is a repeat (only Cancel ends a job so): answered OK with it at once
  // when its cancel is recorded (a save taken after it succeeded, whatever
  // later saves did), else as below. NOT_FOUND;
  // FAILED_PRECONDITION when the job ended otherwise (SUCCEEDED, FAILED);
  // UNAVAILABLE while a success's or failure's end waits to be saved
  // (shown RUNNING: ShowUnsavedEndLocked), and when the
  // store did not record it, or not within options.cancel_save_wait: the
  // job is cancelled here (its workers are stopped) and the save is
  // retried every second (or still queued), but a coordinator that stops
  // before one succeeds restores the job and runs it again. Asked again
  // then, Cancel saves once more and answers as for a first cancel.
  // `answer_within` shortens that wait to the caller's deadline (less the
  // answer's way back, CallerWaitBudget): a client with a deadline under
  // the wait got DEADLINE_EXCEEDED while the save went through.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id,
                                 absl::Duration answer_within = absl::InfiniteDuration());
  // NOT_FOUND; FAILED_PRECONDITION while the job is not planned yet. The
  // measured timeline (Plan.measured_*) is drawn after the lock is let go.
  // kWithoutDrawings: the plan without any drawing (plan_drawings.h), for
  // callers that read only its numbers (each /metrics scrape): neither
  // copied nor drawn. kWithoutMeasured: with the predicted drawings but
  // without drawing the measured timeline (REST's timeline.svg drew it, up
  // to tens of megabytes, at every request to throw it away).
  // kMeasuredTimelineSvg: job_id, version, measured_step and
  // measured_timeline_svg alone, for REST's measured-timeline.svg: under
  // the lock only the traced step is copied (not the plan's predicted
  // drawings, tens of megabytes), and its Chrome trace is not drawn.
  enum class PlanParts { kAll, kWithoutDrawings, kWithoutMeasured, kMeasuredTimelineSvg };
  absl::StatusOr<v1::Plan> GetPlan(const std::string& job_id,
                                   PlanParts parts = PlanParts::kAll) const;

  // From workers. NOT_FOUND (unknown job); PERMISSION_DENIED (the worker is
  // not part of the job); FAILED_PRECONDITION (its plan version is stale, or
  // the job ended); INVALID_ARGUMENT (more losses than micro-batches, an
  // iteration outside [0, steps), busy, idle or eval seconds outside [0,
  // 1e6], a weights digest over 64 bytes, an error text over 16 KiB).
  // The response's all_ready answers the start barrier (request.ready).
  // `counted` (may be null) says what of an OK report the job took, for
  // the metrics: a repeated report, one of a stopped plan or a loss the
  // job does not keep (another replica's) is answered but not counted.
  struct ProgressCounted {
    bool stage_time = false;  // its busy and idle seconds were added
    bool step = false;        // its losses made the job's step
    // With stage_time: the reporter's place in Job.worker_ids (of
    // `workers`) and the job's replicas and tensor ranks (at least 1), so
    // that the caller need not copy the whole job to find its stage.
    int worker_index = 0, workers = 0, replicas = 1, tensor = 1;
  };
  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request, ProgressCounted* counted = nullptr);
  // One chunk of a stage's final weights, checked before anything is
  // allocated against the tensors the worker's stage owns (the parameters
  // of its backward units, gpt_config.h UnitParameterShapes):
  // PERMISSION_DENIED for a tensor of another stage; INVALID_ARGUMENT for an
  // unknown tensor, a shape other than the model's, values that do not
  // fit (offset), or chunks scattered past kMaxWeightsRuns; the other codes
  // as ReportProgress. UNAVAILABLE (nothing kept: send the upload again)
  // when the weights file cannot be created for a passing shortage (EINTR,
  // EAGAIN, EMFILE, ENFILE, ENOMEM); another failure to create or write it
  // (a full disk, EIO) fails the job, and is answered.
  absl::Status AddWeightsChunk(const v1::WeightsChunk& chunk);
  // The worker sent all its weights (end of its UploadWeights stream).
  absl::Status FinishWeights(const std::string& worker_id, const std::string& job_id);

  // Takes `worker_id` out of service (see "Step boundaries"). NOT_FOUND
  // for an unknown worker; FAILED_PRECONDITION when it is LOST or LEFT, or
  // its job has no checkpoints, or would be left with fewer than
  // spec.elastic.min_workers stages and no spare READY worker to take its
  // place. Answered once the state store has the drain
  // (WorkerRegistry::MarkDrained: the process keeps it through a
  // coordinator restart even before it heard of it); UNAVAILABLE when the
  // save failed (drained here all the same; asking again saves again).
  // Idempotent. Waits for the store: not for a gRPC reaction.
  absl::StatusOr<v1::Worker> Drain(const std::string& worker_id);
  // Whether `worker` (its id and incarnation, as the registry lists it) is
  // drained: by Drain, or it registered as a drained process
  // (RegisterWorkerRequest.drained, which the registry's record keeps).
  // Does not wait for the jobs lock (drained_mu_): heartbeats ask it.
  bool IsDrained(const v1::Worker& worker) const;

  // Registry loss listener: incarnation `incarnation` of the worker left
  // `job_id`, for `reason`; the job recovers (or fails) without that
  // incarnation, and takes the worker again once it has registered anew.
  void OnWorkerLost(const std::string& worker_id, const std::string& job_id,
                    const std::string& reason, int64_t incarnation);

  // Starts queued jobs that have enough READY workers, oldest first. A job
  // that cannot be placed does not hold up later ones that can (backfill),
  // but aging bounds what they take: the first QUEUED job left short that
  // has waited past half its spec.scheduling.queue_timeout, and that the
  // cluster's workers could hold once the busy ones are freed, keeps the
  // READY workers it can use (up to its need) for the pass; later jobs
  // backfill onto the others only, so a stream of small jobs cannot starve
  // it until it fails. A QUEUED job older than its queue timeout FAILS
  // with a reason saying what it waited for. While a job is PROFILING,
  // later jobs wait.
  void ScheduleQueued();
  // A thread calling ScheduleQueued every `period` until the destructor.
  void StartSchedulingLoop(absl::Duration period = absl::Milliseconds(100));

  // Waits until the file and store work queued so far (state commits,
  // manifests, expired checkpoints) is done. For tests and shutdown.
  void FlushIo();
  // Tests only (the coordinator's --test-hold-io-at-stop): the I/O queue's
  // next task never returns, as a file operation on a file system that
  // stopped answering would not; every task behind it, the destructor's
  // last saves included, and so the destructor, wait for good.
  void HoldIoForTesting();

  // Per-job counters for metrics: (state -> count).
  std::map<v1::JobState, int> CountByState() const;
  // How many listed jobs' latest save to options.state failed: each is
  // saved again every second until a save succeeds, and a restart (or
  // failover) meanwhile restores it as last saved (an ended job RUNNING
  // again), its expired checkpoints kept on disk. Thread-safe.
  int JobsWithFailedSave() const;
  // How long the oldest unfinished task on the jobs' I/O queue has waited
  // or run (elapsed clock); zero when the queue is idle. The queue runs
  // state saves and checkpoint file work (manifests, removals, sweeps) one
  // at a time: a file system that stopped answering (a hard-mounted NFS
  // server gone) holds every later save, though none has failed.
  // Thread-safe.
  absl::Duration IoQueueAge() const { return io_.OldestTaskAge(); }
  // The same for the final weights file syncs (RunWeightsSyncLocked) and
  // the placements' plans (RunInBackgroundLocked): the destructor waits for
  // the sync running and the plan being computed (each monotonic clock);
  // zero with options.background_runner. For the coordinator's shutdown
  // bound, which cuts off a sync (the job trains again from its last
  // checkpoint). Thread-safe; not once the destructor has begun.
  absl::Duration WeightsSyncAge() const {
    return weights_sync_ ? weights_sync_->OldestTaskAge() : absl::ZeroDuration();
  }
  absl::Duration PlanningAge() const {
    return background_ ? background_->OldestTaskAge() : absl::ZeroDuration();
  }
  // How many jobs' latest delete from options.state failed: pruned jobs,
  // which a restart (or failover) meanwhile brings back, and submits that
  // failed, whose paths and request_id stay held (JobRecord::unsettled).
  // Each is deleted again every second until a delete succeeds.
  // Thread-safe.
  int JobsWithFailedDelete() const;

  // The bytes of the traced steps `job_id` keeps (the one shown and the one
  // being collected), as serialized; 0 for an unknown job. For tests.
  size_t TracedBytesForTesting(const std::string& job_id) const;
  // How many checkpoint manifests of `job_id` wait for a save that
  // succeeds (manifests_after_save_). For tests.
  size_t HeldManifestsForTesting(const std::string& job_id) const;
  // How many times a job's profile was serialised to JSON for its stored
  // record since construction: once per profile set (first plan, restore),
  // not per save. For tests.
  int64_t ProfileJsonsBuiltForTesting() const;

 private:
  // A stretch of failures of a write that is tried again until it
  // succeeds (a job's save or delete, a manifest): how many failed in a
  // row, since when, and when the next line may be logged (elapsed_clock_).
  // The first failure is logged, then one a minute: a line at each retry
  // (every second, per job, while the store fails) buried the first one,
  // and its cause, under thousands an hour.
  struct FailureStretch {
    int64_t count = 0;
    absl::Time since;
    absl::Time next_log = absl::InfinitePast();
    // Counts a failure at `now`; whether to log it (the first of the
    // stretch, then at most once a minute).
    bool Note(absl::Time now);
    // "" after one failure, else " (N <what> in a row failed over D)".
    std::string InARow(absl::Time now, absl::string_view what) const;
  };
  struct StageProgress {
    bool ready = false;  // passed the start barrier
    int64_t iterations_done = 0;
    bool finished = false;
    bool weights_done = false;
    std::string weights_digest;  // with data parallelism, sent with `finished`
  };
  // Where a placement comes from: what finishing it does besides starting
  // the job, and what a failure or a lost worker means for it.
  enum class PlacementOrigin {
    kInitial,   // QUEUED: a failure FAILS the job; a loss re-queues it
    kRecovery,  // RECOVERING: a failure FAILS it; a loss goes back to waiting
    kBoundary,  // a step boundary (join, drain): a loss starts a recovery
  };
  // A placement being planned off the lock (the job is PLANNING). Its
  // workers are already assigned to the job in the registry.
  struct PendingPlacement {
    PlacementOrigin origin = PlacementOrigin::kInitial;
    std::vector<std::string> workers;  // replica, stage, rank order
    std::vector<v1::Worker> infos;     // as registered when planning began
    std::optional<v1::ResumeFrom> resume;
    std::string reason;          // for the plan history
    std::string failure_prefix;  // before a planning error in the job's reason
    int64_t version = 0;
    // kRecovery: applied to the progress once the plan is in (nothing is
    // recorded while a job recovers or plans, so they still hold then).
    int64_t resume_step = 0;
    int64_t redone = 0;
    absl::Time planning_start;  // elapsed_clock_
    // kBoundary, kRecovery: the spare workers added to the job's own (its
    // survivors, or its workers not drained); a refused plan is tried again
    // without them (RetryWithoutJoinersLocked).
    std::vector<std::string> joiners;
    // The joiners a refusal for memory dropped (id -> incarnation) before
    // this plan, on the rest, was tried: if it is refused too, they are
    // not unfit after all (the model needs more workers than the rest, not
    // other ones), and a later worker is tried with them (WaitForRoomLocked).
    std::map<std::string, int64_t> dropped_for_memory;
  };
  // A job's weights file, created off the lock by the first upload that
  // needs it (it reserves the whole model's bytes with fallocate, and on
  // a file system without it, NFS before 4.2, creates the file unreserved;
  // a slow volume still makes it take a while); the job's other uploads
  // wait for it here, not on the manager (the API runs uploads on a few
  // strands by worker, so other jobs' uploads on the same strand wait too:
  // weights_upload.h).
  struct WeightsFileCreation {
    // Set under the manager's lock, before any upload waits; read-only after.
    std::string output_dir, name, job_id;
    std::vector<SafetensorsTensorSpec> tensors;  // the model's unit order
    std::map<std::string, size_t> index;         // tensor name -> index
    AnnotatedMutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    std::shared_ptr<SafetensorsFileWriter> file ABSL_GUARDED_BY(mu);
  };
  // A checkpoint expired from the catalog. Files of its step directory
  // modified after its manifest (or, with none, at or after `at`) are a
  // redo's of the same step (the catalog had to forget the step before it
  // could be written again), and stay when it is removed.
  struct ExpiredCheckpoint {
    v1::ResumeFrom from;
    // When it expired (real time); InfinitePast (every unit file stays
    // without a manifest) for one forgotten for a redo or restored at a
    // restart: a redo may write there on a file server whose clock is
    // behind this host's.
    absl::Time at;
    // Its removals that failed in this process (RemoveExpiring keeps it
    // listed, to try again: kMaxExpiredRemovalTries,
    // kExpiredRemovalRetryFor), when the first did (elapsed clock), and the
    // time that first took its files' bound from: its manifest may be gone
    // by a retry.
    int failed_removals = 0;
    absl::Time first_failed = absl::InfiniteFuture();
    std::optional<absl::Time> files_before;
    // Its manifest goes whatever its time (a checkpoint dropped as
    // unusable: its manifest's write may have run late; RemoveCheckpointDir).
    bool manifest_whatever_its_time = false;
    // Dropped as unusable: the plan version it was dropped on. Its files'
    // bound is then read from their own times (DroppedFilesBound), not
    // taken from the manifest or `at`.
    std::optional<int64_t> dropped_on_plan;
    // After a failed removal, when RetryExpiringLocked tries it again
    // (elapsed clock; kExpiredRemovalBackoff); InfiniteFuture while that
    // try waits on io_.
    absl::Time next_try = absl::InfinitePast();
  };
  struct JobRecord {
    v1::Job job;
    ResolvedJobSpec resolved;
    v1::Plan plan;
    // Per stage, what the coordinator reads back of its Assignment (the
    // hub holds the whole one): not its n data-plane keys and peer
    // addresses, which a 1024-worker job's n stages made a second copy of
    // n^2 strings (about 190 MiB), kept past the job's end.
    struct AssignedStage {
      v1::Program program;
      std::optional<v1::ResumeFrom> resume;
    };
    std::vector<AssignedStage> assignments;
    std::map<std::string, int> stage_of;  // worker id -> stage
    // Tensor name -> (owning stage, shape): what UploadWeights may carry.
    std::map<std::string, std::pair<int, Shape>> weight_owner;
    std::vector<StageProgress> stages;
    absl::Time last_step_time;  // elapsed_clock_
    // Whether a step of the current plan has completed: the first one's
    // time includes the workers' start (the corpus loaded, peers
    // connected, a checkpoint read), and is not throughput.
    bool stepped_on_plan = false;
    // The workers' traces (ReportProgressRequest.trace, by stage index) of
    // the latest step every worker of the plan traced, and of the traced
    // step being reported; a new plan starts them afresh. Only the leading
    // lanes the measured timeline draws keep their trace (`drawn_lanes`,
    // as LeadingLanesWithin decides from the programs' sizes): a job of
    // 256 workers can send 6M timings a traced step, about 450 MB, where
    // kMaxMeasuredTimelineTimings are drawn. The others count as arrived.
    struct TracedStep {
      int64_t iteration = -1;
      std::map<int, v1::StepTrace> by_stage;  // stages below drawn_lanes
      std::set<int> arrived;                  // every stage that sent it
      int drawn_lanes = 0;
    };
    TracedStep traced, tracing;
    // The final weights file, written as the stages upload (created at the
    // first chunk: nothing of it is held in memory), its tensors' indices
    // by name, and the elements of each received so far.
    // Shared with the uploads writing into it outside the lock.
    std::shared_ptr<SafetensorsFileWriter> weights_file;
    std::map<std::string, size_t> weights_index;
    // The weights file being created (null before the first chunk, and
    // once dropped): an upload that finds another one here is the job's
    // no longer.
    std::shared_ptr<WeightsFileCreation> weights_creation;
    std::map<std::string, CoveredRanges> weights_covered;
    // weights_covered's runs, summed: bounded by kMaxWeightsRuns.
    int64_t weights_runs = 0;
    std::string profile_error;  // why the measured profile could not be had
    // Profiles that failed because their worker left (drained, stopped or
    // lost meanwhile): tried again on another, up to kMaxProfileAttempts.
    int profile_attempts = 0;
    // The worker that profiled the model for this job; empty when the
    // profile came from the cache (an earlier job's).
    std::string profiled_by;
    // The worker profiling the model for this job (held from other jobs
    // while profile_in_flight: HeldWorkersLocked), and whether its fetch
    // has not returned yet, whatever the job's state since (a cancelled
    // job's fetch is cancelled too, and its worker held until it returns).
    std::string profiling_on;
    // Its data address, and whether its loss was logged (the fetch is
    // cancelled at every pass while it is lost: CancelAbandonedProfilesLocked).
    std::string profiling_address;
    bool profile_cancel_asked = false;
    // How profiling_on runs attention (the analytic sizes its profile is
    // checked against and completed with).
    AnalyticAttention profiling_attention = AnalyticAttention::kCpu;
    bool profile_in_flight = false;
    // The profile the first plan used; re-plans reuse it (no profiling in
    // the middle of a recovery), with memory sized for the attention of
    // the workers each plan places (ProfileForAttentions). Set only by
    // SetProfileLocked, which keeps profile_json its compact JSON, the
    // stored record's: built once, not at every save (a 256-layer
    // profile's is about 200 KB and 3 ms, under mu_, once a second per
    // running job), as the profile does not change after the first plan.
    std::optional<ModelProfile> profile;
    std::string profile_json;  // empty while profile is unset
    std::string profile_source;
    // How the worker the profile is of ran attention (the first plan's
    // first worker); nullopt in state stored before it was kept.
    std::optional<AnalyticAttention> profile_attention;
    double reference_gflops = 0;
    // spec.checkpoint (null without).
    std::unique_ptr<CheckpointCatalog> checkpoints;
    // Ended, its checkpoint directory's leftovers being removed on io_
    // (sweeps queued or awaited, see CheckpointSweepLocked): the
    // directory stays this job's (CheckpointDirUserLocked) until that is
    // done, so a new job's files are never among them.
    int checkpoint_sweeps_pending = 0;
    // The second sweep waits for these workers (the job's at its end) to
    // have stopped (WorkerRegistry::StoppedSince `late_sweep_since`), or
    // for `late_sweep_by` (elapsed_clock_): they may write a step or two
    // after the end.
    std::vector<std::string> late_sweep_workers;
    absl::Time late_sweep_since, late_sweep_by;
    // While RECOVERING: when the loss was detected (elapsed_clock_), why,
    // which workers are known lost, and the other former workers, who must
    // prove they are alive (a heartbeat since `recovery_started`) or be
    // declared LOST before the job re-plans.
    absl::Time recovery_started;
    // Each of `survivors`' last heartbeat as the registry showed it when the
    // recovery started (InfinitePast: not registered): one it shows since
    // that differs is a heartbeat after it. Compared for a change, not for
    // order, as those times are the wall clock's, which may step back.
    std::map<std::string, absl::Time> heartbeat_at_recovery;
    std::string recovery_reason;
    std::map<std::string, int64_t> lost;  // worker id -> incarnation lost
    std::vector<std::string> survivors;
    // Spare workers (id -> incarnation) a re-plan of this job was refused
    // with: not offered to it again unless they register anew.
    std::map<std::string, int64_t> unfit;
    // Workers (by id: a crash gives the next process a new incarnation)
    // lost while joining this job, before their stage's first step: not
    // offered to it again until `until` (elapsed clock), a minute after
    // the first such loss, doubling each time up to an hour; forgotten once
    // the worker completes a step of the job. A node whose worker died
    // each time it joined (killed for memory loading its stage, say) and
    // came back under the same id was taken again and again: recovery,
    // growth, reload, crash, for as long as it restarted. Not stored: a
    // coordinator restart forgets them. Only joiners count (not the first
    // plan's workers, nor a survivor given a larger stage), and only under
    // their id: a pod restarted under a new id is a new worker. A recovery
    // waiting for more workers names those held back.
    struct JoinCrash {
      int count = 0;
      absl::Time until;
    };
    std::map<std::string, JoinCrash> join_crashes;
    // The workers (id -> incarnation) of the last re-plan (a boundary's or
    // a recovery's) refused for memory without spares, with the spares
    // dropped before it, and why: a recovery does not plan on the same
    // set again (it would be refused again) but waits for another worker.
    // Cleared when a plan is in.
    std::map<std::string, int64_t> refused_for_memory;
    std::string refused_for_memory_note;
    // Checkpoints expired from the catalog whose directories are not known
    // to be removed (store::StoredJob.expiring): each save lists them, and
    // after a save that succeeded, those it listed go (until then the
    // stored state may still name them as complete); a failed save leaves
    // them to the next, a retry's included. A removal that failed is tried
    // again by the scheduling pass on a backoff (RetryExpiringLocked), not
    // at the next save.
    std::vector<ExpiredCheckpoint> expiring;
    // Each stage's last failed checkpoint report counted, by stage ("plan
    // version/step"): the same one again is a retry, not another failure.
    // By stage: one key for the job took a stage's retry for a new failure
    // once another stage's failure came between (a full disk fails them
    // all at once). A stage writes its checkpoints in order, so its last
    // is the one a retry repeats.
    std::map<int, std::string> last_checkpoint_error_by_stage;
    int recoveries_without_progress = 0;
    // The furthest step any complete checkpoint reached (stored, so a
    // restart does not lower it to the latest); only a checkpoint beyond
    // it resets recoveries_without_progress.
    int64_t furthest_checkpoint_step = 0;
    // After a re-plan, until the first step completes on it (for the
    // recovery time): when the loss was detected, and the two phases
    // (elapsed_clock_, as the re-plan's time).
    std::optional<absl::Time> recovering_since;
    double recovery_waiting_seconds = 0, recovery_planning_seconds = 0;
    absl::Time replanned_at;
    // A job restored after a restart waits this long for its LOST former
    // workers to register again (elapsed_clock_).
    absl::Time restart_grace_until;
    absl::Time last_persisted;  // elapsed_clock_
    // When it was submitted, on elapsed_clock_ (restored: as long ago as
    // its create_time): its queue timeout counts from there.
    absl::Time queued_since;
    // Whether a save of this job had to leave parts out to fit the store
    // (stored_job_fit.h): said once in the log, not at every save.
    bool stored_record_trimmed = false;
    // Saves in a row whose record stayed over the store's limit after all
    // that (each fails): said once a minute, not at every save.
    FailureStretch unfit_saves;
    // A job submitted with spec.parallelism.data 0 (auto): its
    // spec.parallelism.workers. Every plan, re-plans after a loss or a
    // join included, chooses the layout again for the workers it gets, 1
    // to this many (ChooseJobLayout); 0 for a job that named its layout.
    int auto_layout_workers = 0;
    // Its spec.compression.data_parallel as submitted: the layout chosen
    // may drop it (one replica), the next choice takes it again.
    v1::DataParallelCompressionSpec auto_layout_compression;
    // Its spec.parallelism as submitted (resolved): with tensor 0 (auto)
    // the layout chosen names its T and may drop the tensor fields (one
    // rank per stage); the next choice searches T again with them.
    v1::ParallelismSpec auto_layout_parallelism;
    // spec.init.from, resolved at submit: the checkpoint the job starts from
    // (its step is init_step), or a weights file (step 0).
    std::optional<v1::ResumeFrom> init_checkpoint;
    std::string init_weights;
    int64_t init_step = 0;
    // Where it starts from, relative to the output directory: the
    // checkpoint's step directory or the weights file ("" for none). No new
    // job may take a checkpoint directory holding it while this one lives.
    std::string init_source;
    // With job.request_id: RequestSpecSha256 of the spec it was submitted
    // with (a Submit repeating the id must repeat the spec).
    std::string request_spec_sha256;
    // In submitting_ after Submit could neither save the job nor make sure
    // the store dropped it (the store may hold it, and a restart bring it
    // back): it keeps its id, paths and request_id claimed until a delete
    // of it commits (SettleSubmitsLocked; `settling` while one runs).
    bool unsettled = false;
    bool settling = false;
    // A pending step boundary: the step the stages stop after (0: none) and
    // why; the workers to re-plan on are chosen when it is reached.
    int64_t stop_at = 0;
    std::string boundary_reason;
    // The spares a growth boundary was asked for (its reason names them).
    std::vector<std::string> boundary_joiners;
    // The spares held for the job while stop_at, or a placement, is pending
    // (HoldsSparesLocked, HeldWorkersLocked): the growth boundary's
    // joiners, and those a drain was allowed on the strength of
    // (HoldBoundarySparesLocked). A new placement starts with none. Without the
    // hold, a job placed meanwhile, or a drain of the spare itself, would
    // take them and the boundary stops every stage for nothing, or leaves
    // the job waiting for a worker until its queue timeout.
    std::vector<std::string> boundary_held;
    // While PLANNING: the placement being planned, and its number (a
    // planning task whose number is not the job's current one, or that
    // finds the job no longer PLANNING, was overtaken and is dropped).
    std::optional<PendingPlacement> pending;
    int64_t placement = 0;
    // The first plan did not fit in the memory of the workers first in
    // line: the next placement takes the READY workers with the most memory
    // (RoomiestWorkers), and a refusal there FAILS the job.
    bool place_by_memory = false;
    // Every stage finished and its weights are in: the file is being
    // written (the job is still RUNNING; its workers are done, so losses
    // and reports no longer matter).
    bool writing_weights = false;
  };

  JobRecord* FindLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // In the lookups of a path's holder below, "has not ended" is as
  // EndedForOthersLocked says: a job whose end is unsaved (a success, a
  // failure or a cancel) has not.
  //
  // A job that has not ended (or whose checkpoint_sweep_pending) and
  // checkpoints into `dir`, a directory inside it, or one it lies in (the
  // paths nest), or null.
  const JobRecord* CheckpointDirUserLocked(const std::string& dir) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Another job than `record` whose checkpoint directory overlaps
  // `record`'s and that may have written there since `record` did: one
  // not ended, or one created after it (it took over the directory once
  // `record` had ended); or null. Of ended jobs sharing a directory, the
  // one created last owns it.
  const JobRecord* OtherCheckpointDirUserLocked(const JobRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step directories of the complete checkpoints of every job, in any
  // state, whose checkpoint directory overlaps `dir`: what a sweep of
  // `dir` keeps, manifest or not.
  std::set<std::string> CompleteCheckpointsOverlappingLocked(const std::string& dir) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that has not ended (or whose checkpoint_sweep_pending) whose
  // checkpoint directory holds `path`, or null.
  const JobRecord* CheckpointDirHoldingLocked(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that has not ended whose init_source lies in `dir`, or null.
  const JobRecord* InitSourceInLocked(const std::string& dir) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that has not ended whose init_source is `path` or holds it (a
  // file of the checkpoint directory it started from), or null.
  const JobRecord* InitSourceHoldingLocked(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that has not ended whose weights file lies in `dir`, or null.
  const JobRecord* WeightsPathInLocked(const std::string& dir) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job holding a path, as refusals name its state: the state as Get
  // shows it (RUNNING for a success whose end is unsaved; CANCELLED, saying
  // it waits to be saved, for such a cancel), or for a Submit left
  // unsettled (in no list) what became of it.
  std::string HolderStateLocked(const JobRecord& record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // " (<HolderStateLocked>)" then, for an ended holder whose leftovers are
  // being removed, when to retry (inside the parentheses), for an unsaved
  // cancel nothing (FilesInUseErrorLocked says to retry), else
  // `live_advice` (e.g. ", give this job a directory of its own").
  std::string HolderStateAndAdviceLocked(const JobRecord& record,
                                         absl::string_view live_advice) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Submit refused because `holder` holds a path the spec names:
  // UNAVAILABLE when that passes by itself (an ended job's leftovers being
  // removed, an unsettled submit being dropped, an unsaved cancel being
  // saved; a retry succeeds), INVALID_ARGUMENT while `holder` is live, a
  // success or failure whose end is unsaved included (the spec must
  // change).
  absl::Status FilesInUseErrorLocked(const JobRecord& holder, const std::string& message) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job an earlier Submit with `request_id` made, when its spec had
  // `spec_sha256` (RequestSpecSha256); null when none did or `request_id`
  // is empty. ALREADY_EXISTS when it had another spec; UNAVAILABLE while
  // that job is in submitting_ (being saved, or unsettled).
  absl::StatusOr<const JobRecord*> EarlierSubmitLocked(const std::string& request_id,
                                                       const std::string& spec_sha256) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether submitting_ holds a job created before `record` whose save (or
  // delete after a failed one) is still running: it may yet be listed.
  // Unsettled ones never are.
  bool OlderSubmitSavingLocked(const JobRecord& record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that has not ended whose final weights file is `path`, lies under
  // it or holds it (the paths nest: one would have to be a directory and a
  // file at once), or null.
  const JobRecord* WeightsPathUserLocked(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The profile request of a job, and the profile to plan it with (and a
  // description of where it came from); starts PROFILING and returns false
  // when the job must wait for a measured profile.
  v1::ProfileRequest ProfileRequestFor(const JobRecord& record) const;
  // Why `record` must not be profiled on `workers`, from the model's
  // shapes alone, or "" when it may: no plan can fit their memory (its
  // weights, gradients and AdamW moments, per replica, against the
  // workers' budgets together; its largest unit's against the roomiest
  // worker's), or the profiler's pass of its largest unit would not fit
  // the worker that profiles (workers[0]). Such a job is planned on the
  // analytic profile (and refused for memory when no plan fits). GPU
  // workers' budgets less options_.gpu_memory_reserve_bytes, as plans'.
  std::string NotProfiledForMemory(const JobRecord& record, const v1::ProfileRequest& request,
                                   const std::vector<v1::Worker>& workers) const;
  bool ChooseProfileLocked(JobRecord& record, const std::vector<v1::Worker>& workers,
                           ModelProfile* profile, std::string* source, double* reference_gflops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins the profile fetches that have ended.
  void ReapProfilersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `worker`'s answer to `request`: cached (and saved) only if
  // CheckWorkerProfile finds it fit for the job's model, else the job's
  // profile_error and the analytic profile; but a failure of a worker that
  // has since been drained or left (its profile was cut short as it
  // stopped), registered again (not `incarnation`, the one asked) or had
  // its call cancelled as lost leaves the job to be profiled again on
  // another worker, up to kMaxProfileAttempts times. A fetch past its
  // deadline is remembered for later jobs (profile_timeouts_); the first
  // for its key leaves the job to be profiled again on another worker of
  // the kind, not on that one.
  void FinishProfiling(const std::string& job_id, const std::string& key, const std::string& worker,
                       int64_t incarnation, const v1::ProfileRequest& request,
                       const absl::StatusOr<v1::ModelProfile>& profile);
  absl::Status StartLocked(JobRecord& record, const std::vector<std::string>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts planning the job on `workers` with its recorded profile, as plan
  // version + 1, resuming from pending.resume (none: spec.init.from, or
  // step 0): assigns the workers to the job, goes PLANNING and hands the
  // planning to the runner; FinishPlacement sends the assignments. An error
  // (a worker no longer READY, or gone) changes nothing: the caller tries
  // again or recovers.
  absl::Status BeginPlacementLocked(JobRecord& record, const std::vector<std::string>& workers,
                                    PendingPlacement pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a planning task is given (copies: it runs without the lock) and
  // what it returns.
  struct PlanningInput {
    std::string job_id;
    int64_t version = 0;
    int workers = 0;
    ResolvedJobSpec resolved;
    int auto_layout_workers = 0;
    v1::DataParallelCompressionSpec auto_layout_compression;
    v1::ParallelismSpec auto_layout_parallelism;
    ModelProfile profile;
    std::string profile_source;
    ClusterSpec cluster;
    std::string shared_memory;  // PlanMemoryBudgets: what a worker's memory is a share of
    std::string reason;
    absl::Time queued_at;  // handed to the background runner (elapsed_clock_)
  };
  struct PlanningOutput {
    absl::Status status;
    CompiledPlan compiled;
    std::optional<ResolvedJobSpec> chosen;  // an auto layout's spec
    // An auto layout's position order of the placed workers (indices into
    // PendingPlacement::workers; ChosenJobLayout::order); empty: theirs.
    std::vector<size_t> order;
    std::string placed_reason;  // reason, and the layout chosen
    // Every worker's data-plane keys for this plan ([w] for worker w).
    std::vector<DataPlaneKeys> data_plane_keys;
    // Seconds waiting for the background thread, and computing (both 0 when
    // it was not computed, at shutdown).
    double queued_seconds = 0;
    double computing_seconds = 0;
  };
  static PlanningOutput PlanPlacement(const PlanningInput& input);
  // A planning task's end: sends the assignments (CommitPlacementLocked),
  // or FAILS the job with the planning error; drops an overtaken one. A
  // first plan refused for memory goes back to QUEUED instead when other
  // READY workers have more memory (RetryWithMoreMemoryLocked).
  void FinishPlacement(const std::string& job_id, int64_t placement, PlanningOutput output);
  void CommitPlacementLocked(JobRecord& record, PendingPlacement pending, PlanningOutput output)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's first placement, on `pending`'s workers, was refused for
  // memory (`refusal`): when the READY workers with the most memory are
  // another set, releases these and re-queues the job to be placed on
  // those, and returns true; false (nothing changed) otherwise.
  bool RetryWithMoreMemoryLocked(JobRecord& record, const PendingPlacement& pending,
                                 const absl::Status& refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A re-plan (at a boundary, or a recovery's) that took spare workers was
  // refused (`refusal`): a worker too small for its share, say, must not
  // end a job that ran on the others. Marks the spares unfit for this job
  // and plans again without them; with too few left, a boundary's job
  // recovers (kReplanRefused) and a recovering one waits again. Refused
  // for memory with too few left (below elastic.min_workers) on fewer than
  // max_workers, the spares are not unfit: the job waits for another
  // worker with all of them (at max_workers it waits without them), as
  // WaitForRoomLocked. Refused for memory with such spares kept from before
  // and a newcomer, only the earlier ones are unfit, and the job plans on
  // the rest with the newcomers. Returns false (nothing changed) when the
  // plan took no spares.
  bool RetryWithoutJoinersLocked(JobRecord& record, PendingPlacement& pending,
                                 const absl::Status& refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A re-plan (at a boundary, or a recovery's) on the job's own workers
  // only was refused for memory (`refusal`): they cannot hold the model
  // without the one drained or lost, but a worker may join (a restarted
  // pod, a larger node). Records them and the spares dropped before
  // (refused_for_memory) and the job recovers, waiting for another worker
  // until spec.scheduling's queue_timeout, instead of failing at once.
  // Returns false (nothing changed) for an initial placement, a plan with
  // spares, one on as many workers of its own as the job may have (no
  // worker could join them), or another error.
  bool WaitForRoomLocked(JobRecord& record, const PendingPlacement& pending,
                         const absl::Status& refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WaitForRoomLocked's change, its conditions checked by the caller: the
  // workers of `pending` (and the spares dropped before it) are recorded in
  // refused_for_memory, unmarked unfit, and the job recovers. Returns true.
  bool WaitForAnotherWorkerLocked(JobRecord& record, const PendingPlacement& pending,
                                  const absl::Status& refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The recovering job `worker_id` survived (not lost to it), if any.
  JobRecord* RecoveringJobOfLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the record's boundary_held holds: RUNNING with a boundary
  // pending, or PLANNING.
  static bool HoldsSparesLocked(const JobRecord& record);
  // The job whose pending boundary or placement holds `worker_id` as a
  // spare (boundary_held), if any.
  JobRecord* BoundaryHolderOfLocked(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The recovering job (with checkpoints) that can re-plan with the spare
  // `worker_id` but not without it, if any: a drain of that spare would
  // leave it waiting until its queue timeout.
  JobRecord* RecoveryCountingOnLocked(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The registry's workers as one scheduling pass (ScheduleQueued) read
  // them, once (job_manager_scheduling.cc). The helpers below that take one
  // (`pass`, not null) read the workers from it instead of the registry:
  // from there, each recovering job read every worker's record again, and
  // again for every other recovering job's spares (K^2 x workers record
  // copies a pass, under the jobs lock).
  class PassWorkers;
  // The job's own workers, drained ones included: a placement's while it
  // is planned, a recovery's survivors neither lost nor gone since
  // (LOST, LEFT or forgotten past a restart's grace), else its plan's.
  std::vector<std::string> OwnWorkersLocked(const JobRecord& record,
                                            const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many workers `record` could re-plan on once `without` is gone
  // ("": as it is): of its own (OwnWorkersLocked) not drained and the
  // spares it may count on (OwnSparesLocked), those a plan could use
  // (UsableSetLocked: whole stages, and with stages of one device kind an
  // arrangement by kind; a mere count took spares of the wrong kind for a
  // stage's place).
  int UsableWorkersLeftLocked(const JobRecord& record, const std::string& without) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The spares `record` may count on: SparesForLocked of the workers held
  // for no other job (its own boundary's holds are its own), those it holds
  // first.
  std::vector<std::string> OwnSparesLocked(const JobRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a RUNNING job with a pending boundary, or one being planned: holds
  // (boundary_held) as many spares as its undrained workers (the
  // placement's, while planned) need to make MinJobWorkers usable at the
  // boundary, those held already first, and keeps holding its growth
  // joiners. What a drain counted on stays there for the re-plan.
  void HoldBoundarySparesLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers held for jobs that are not running on them: recovering
  // jobs' survivors (they wait for them), the spares a running job's
  // pending boundary is to add, and the workers profiling a model (a
  // job's plan measured there while it trained another job's would be
  // skewed for every later job of the model). Not spares to any job.
  std::set<std::string> HeldWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether no job waits for spare workers (besides `reserved`): none is
  // PROFILING or PLANNING, no QUEUED one can run on a spare, and no
  // RECOVERING one could use one (`except` not counted). Callers put the
  // spares QUEUED jobs can run on in `reserved`, so that growth, a
  // boundary, and a recovery past its size before the loss use only the
  // rest.
  // The spares (SpareWorkersLocked(reserved)) some QUEUED job can run on:
  // those it waits for, kept from growth, boundaries and a recovery past
  // its former size. One queued job of each tensor mode is asked
  // (CanRunLocked reads no more of a job).
  std::set<std::string> SparesForQueuedLocked(const std::set<std::string>& reserved,
                                              const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NoJobWaitsForSparesLocked(const std::set<std::string>& reserved,
                                 const JobRecord* except = nullptr,
                                 const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker` can run a stage of `record`'s job: a worker that
  // computes on a GPU (DeviceInfo.gpu_model) cannot run a 3-D
  // tensor-parallel job (spec.parallelism.tensor_mode 3d has no CUDA path:
  // its stages would refuse it once started), so such a job waits for CPU
  // workers. Every worker can run any other job.
  bool CanRunLocked(const JobRecord& record, const std::string& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `workers` less those that cannot run `record` (CanRunLocked), in order.
  std::vector<std::string> ThatCanRunLocked(const JobRecord& record,
                                            std::vector<std::string> workers) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SpareWorkersLocked(reserved) less those unfit for `record`, lost as
  // they joined it not long ago (JobRecord::join_crashes), or that cannot
  // run it.
  std::vector<std::string> SparesForLocked(const JobRecord& record,
                                           const std::set<std::string>& reserved,
                                           const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first of `pending`'s workers that is no longer as it was planned
  // (ASSIGNED to `job_id`, the same incarnation), and why; nullopt when
  // all are. A loss the registry has not told OnWorkerLost about yet.
  std::optional<std::pair<std::string, std::string>> LostSinceAssignedLocked(
      const PendingPlacement& pending, const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The incarnation `infos` hold for `worker_id`; 0 when it is not there.
  static int64_t IncarnationIn(const std::vector<v1::Worker>& infos, const std::string& worker_id);
  // `worker` (its `incarnation`) was lost while the job was PLANNING; see
  // PlacementOrigin.
  void AbandonPlacementLocked(JobRecord& record, const std::string& worker,
                              const std::string& reason, int64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RUNNING (or PLANNING, a boundary's placement abandoned or refused) ->
  // RECOVERING (see the file comment); FAILED instead when the
  // job has no checkpoints or recovered too often without progress.
  // `lost`: a worker known gone (empty when a peer's error reported it),
  // and the incarnation of it that is gone (0: its current one).
  void StartRecoveryLocked(JobRecord& record, const std::string& lost, const std::string& reason,
                           RecoveryKind kind, int64_t lost_incarnation = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes each of record.survivors' last heartbeat as the registry shows
  // it now (record.heartbeat_at_recovery), for TryReplanLocked to tell
  // which have been heard since.
  void NoteSurvivorHeartbeatsLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-plans a RECOVERING job once its former workers are accounted for
  // and enough are READY; else it waits (its reason says for what).
  // `reserved`: the workers no job may take as spares (HeldWorkersLocked:
  // every recovering job's survivors among them); those it places on are
  // added. `pass`: the workers as the scheduling pass read them, which it
  // reads instead of the registry (but for its survivors' records); those
  // it places on are read again into it (ReadAgainLocked).
  void TryReplanLocked(JobRecord& record, std::set<std::string>* reserved, PassWorkers* pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads `workers` (a placement's, just before or after it) again from
  // the registry into `pass`: those no longer spare (drained, stopping a
  // job, gone or assigned since the pass read them) as a reason says it
  // ("w-3 is no longer spare (...)"); empty when every one still is.
  std::string ReadAgainLocked(const std::vector<std::string>& workers, PassWorkers& pass) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker` was among the registry's ReadyWorkers (READY, not
  // stopping its last job) as `pass` read it.
  static bool ReadyInPass(const PassWorkers& pass, const std::string& worker);
  // Asks the job's stages to stop after a step beyond all their progress
  // (see "Step boundaries"); false when the job is too near its end.
  bool RequestBoundaryLocked(JobRecord& record, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-plans at the pending boundary once its checkpoint is complete and
  // the loss of its last step is in.
  void MaybeReplanAtBoundaryLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReplanAtBoundaryLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The READY workers that are drained (placed never, listed READY).
  size_t DrainedReadyLocked(const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "N ready", then the READY workers held for other jobs (HeldReadyLocked)
  // and the drained ones, when there are any (for a waiting job's reason).
  static std::string ReadyCount(size_t ready, size_t held, size_t drained);
  // The READY, undrained workers `record` could run on that `reserved`
  // holds for another job (a profiling fetch in flight, a recovery's
  // survivors, a boundary's spares), leaving out those in `counted`: a waiting job says they
  // exist, rather than "1 ready" beside a listing of 2 READY workers.
  size_t HeldReadyLocked(const JobRecord& record, const std::set<std::string>& reserved,
                         const std::vector<std::string>& counted,
                         const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // READY workers no job holds or waits for, not drained, ascending id.
  std::vector<std::string> SpareWorkersLocked(const std::set<std::string>& reserved) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The `need` of `ready` (in order of preference) that `record` is placed
  // on: the first `need`, but for a job with replicas or tensor ranks
  // (given, not auto) a set whose every stage is of one kind, GPUs or CPUs
  // (ArrangeByDeviceKind; its planning refuses stages that mix them:
  // CheckReplicaDevices), in position order; nullopt when `ready` holds
  // no such set. Requires `need` <= ready.size().
  std::optional<std::vector<std::string>> OneKindPerStageLocked(
      const JobRecord& record, const std::vector<std::string>& ready, int need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The most of `candidates` (in order of preference, kept in it) that a
  // re-plan of `record` can use, at most `most`: the first UsableWorkers;
  // for a job with replicas or tensor ranks (given, not auto) the largest
  // such count with a set whose every stage can be of one kind
  // (OneKindPerStageLocked), empty when no count has one. Recoveries,
  // boundaries and growth choose with it: by count alone they took a
  // worker of the other kind into a stage, planning refused the mix, and
  // the spares were marked unfit for the job while enough of one kind were
  // READY. BeginPlacementLocked puts the set in position order.
  std::vector<std::string> UsableSetLocked(const JobRecord& record,
                                           const std::vector<std::string>& candidates, int most,
                                           const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `spares` (in order) without those of a kind none of `record`'s own
  // workers (OwnWorkersLocked) is, for a job whose stages must each be of
  // one kind (none left: all): the spares a recovery waits for, a drain
  // counts on and a boundary holds. A GPU job waiting for a GPU held every
  // READY CPU worker meanwhile, from queued CPU jobs and from growth.
  std::vector<std::string> OfItsKindsLocked(const JobRecord& record,
                                            std::vector<std::string> spares,
                                            const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether each of `workers` is a GPU worker (one gone since it was
  // counted: a CPU; StartLocked and BeginPlacementLocked then find it gone).
  std::vector<bool> GpuKindsLocked(const std::vector<std::string>& workers,
                                   const PassWorkers* pass = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `workers` reordered so that the `need` with the most memory between
  // them and `beside` (the plan's workers already chosen; RoomiestWorkers)
  // come first; the rest follow in their order.
  std::vector<std::string> RoomiestFirstLocked(std::vector<std::string> workers, int need,
                                               const std::vector<std::string>& beside = {}) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsDrainedLocked(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same, of the registry's record `worker` (its id and incarnation).
  bool IsDrainedLocked(const v1::Worker& worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Known lost during the record's recovery, and not registered again since.
  bool IsLostLocked(const JobRecord& record, const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t IncarnationOf(const std::string& worker_id,
                        const PassWorkers* pass = nullptr) const;  // 0 when unknown
  // A stage's CheckpointWritten report.
  absl::Status AddCheckpointLocked(JobRecord& record, int stage, const v1::CheckpointWritten& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobRecord*> ForWorkerLocked(const std::string& worker_id,
                                             const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job: sets state and reason, sends STOP to its workers, releases them.
  void EndLocked(JobRecord& record, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a job that has just ended (EndLocked; Restore, for the jobs it
  // fails): takes its incomplete checkpoints off its record, and returns
  // the task (for io_; null when there is none) that removes their files
  // and the other step directories without a manifest in its checkpoint
  // directory, written before `ended` (the definition says which are kept
  // and why). Callers post it after the job's final save, so that the end
  // is durable before any removal (a crash during a long one would
  // otherwise lose it) and a cancel does not wait for the files.
  std::function<void()> CheckpointSweepLocked(JobRecord& record, absl::Time ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether stage `g` has done all its part: every step, and its weights
  // upload where it uploads them.
  static bool StageDone(const JobRecord& record, size_t g);
  // Drain's checks and bookkeeping, under the lock (nothing saved).
  absl::StatusOr<v1::Worker> DrainLocked(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills weight_owner from the plan's backward units of `stage` (replica
  // 0's stages only, tensor rank 0 of each: the other replicas hold the
  // same weights and upload and checkpoint nothing; the other tensor ranks
  // gather their shards to rank 0).
  static void RecordWeightOwners(JobRecord& record, int stage);
  // Data parallelism (spec.parallelism.data): the replicas, the stages of
  // one replica in the current plan, and the job's worker bounds (the
  // elastic bounds count one replica's stages).
  static int Replicas(const JobRecord& record);
  // spec.parallelism.tensor (>= 1), and the workers at each stage position
  // of a plan: replicas x tensor ranks.
  static int TensorRanks(const JobRecord& record);
  static int WorkersPerStage(const JobRecord& record);
  static int StagesPerReplica(const JobRecord& record);
  // Whether the job was submitted with data 0 and tensor 0 (auto): every
  // plan chooses its tensor ranks too.
  static bool SearchesTensorRanks(const JobRecord& record);
  // The spec its layouts are chosen from: the current spec with the tensor
  // fields as submitted (auto_layout_parallelism).
  static v1::JobSpec AutoLayoutSpec(const JobRecord& record);
  // An auto layout's bounds are one stage's tensor ranks (searching T: the
  // fewest workers with a layout) and its spec.parallelism.workers.
  static int MinJobWorkers(const JobRecord& record);
  static int MaxJobWorkers(const JobRecord& record);
  // The steps a job's worker count moves in: WorkersPerStage (a stage more
  // or less in every replica), or for an auto layout its tensor ranks (a
  // stage more or less; the replicas are chosen again), 1 when it searches
  // T as well.
  static int WorkerStep(const JobRecord& record);
  // How many of `workers` (>= 0) a plan can use: the largest multiple of
  // WorkersPerStage; for an auto layout, the largest multiple of
  // WorkerStep that has a layout (AutoLayoutDegrees); 0 when none.
  static int UsableWorkers(const JobRecord& record, int workers);
  // Whether each of `record`'s stages must run on one kind of worker (GPUs
  // or CPUs): it has replicas or tensor ranks it named. (An auto layout
  // chooses among layouts that include single-rank, single-replica ones.)
  static bool StagesOfOneKind(const JobRecord& record);
  // Why a job with enough READY workers (`count` says how many) still
  // waits: no `need` of them give each stage workers of one kind.
  static std::string WaitingForKinds(const JobRecord& record, int need, const std::string& count);
  static absl::Status CheckProgressBounds(const v1::ReportProgressRequest& request,
                                          const JobRecord& record);
  // ReportProgress's parts, in the order it takes them.
  // A stage's error: the job recovers (a peer's failure; the plan's resume
  // point unusable while the stage loads it: that checkpoint is dropped; a
  // worker new to this plan (by id: not one restarted under its id)
  // failing before the start barrier, for neither of those: the job goes
  // on without it, kReplanRefused) or FAILS, with the error as its reason.
  void StageFailedLocked(JobRecord& record, int stage_index,
                         const v1::ReportProgressRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker_id` is in the job's current plan but was not in the one
  // before it (a joiner or a replacement); false for the first plan.
  static bool JoinedThisPlanLocked(const JobRecord& record, const std::string& worker_id);
  // INVALID_ARGUMENT when a stage that does not run the model's last unit
  // forward reports a loss (only that stage computes one).
  static absl::Status CheckLossStage(const v1::ReportProgressRequest& request,
                                     const JobRecord& record, int stage_index);
  // Takes the first digest of the job's tokens the job hears (and saves
  // it); a different one later FAILS the job: false then.
  bool TakeDataDigestLocked(JobRecord& record, const v1::ReportProgressRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step's loss (the mean of its micro-batches'), its place in the
  // history, the throughput and the end of a recovery. A NaN or infinite
  // loss FAILS the job: false then.
  bool RecordStepLossLocked(JobRecord& record, const v1::ReportProgressRequest& request,
                            ProgressCounted* counted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The validation loss; a NaN or infinite one FAILS the job: false then.
  bool RecordValLossLocked(JobRecord& record, const v1::ReportProgressRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a worker's trace of a traced step (record.tracing) if its lane is
  // drawn, and moves the step to record.traced once every worker of the
  // plan sent it.
  static void AddTraceLocked(JobRecord& record, int stage_index, const v1::StepTrace& trace);
  // A traced step's programs, traces and worker names, copied out of a
  // record so that drawing it (AddMeasuredTimeline) needs no lock: the
  // first workers' whose timings fit kMaxMeasuredTimelineTimings.
  struct MeasuredStepCopy {
    std::string job_id;
    int64_t iteration = -1;  // -1: none
    int workers = 0;         // of the plan, drawn or not
    std::vector<v1::Program> programs;
    std::vector<v1::StepTrace> traces;
    std::vector<std::string> names;
  };
  static MeasuredStepCopy CopyMeasuredStep(const JobRecord& record);
  // Plan.measured_* from the copy, when it holds a step; without
  // measured_chrome_trace_json unless `with_chrome_trace`.
  static void AddMeasuredTimeline(const MeasuredStepCopy& step, bool with_chrome_trace,
                                  v1::Plan* plan);
  absl::Status CheckWeightsChunkLocked(const JobRecord& record, const v1::WeightsChunk& chunk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where the spec's files may go and come from (options_); see Submit.
  absl::Status CheckPaths(const ResolvedJobSpec& resolved) const;
  // CheckPaths past CheckOutputDirGiven: the paths' confinement, with the
  // filesystem's codes (CheckPaths maps them to a submit's).
  absl::Status CheckPathsConfined(const ResolvedJobSpec& resolved) const;
  // FAILED_PRECONDITION when the file system `parent` (the weights file's
  // directory, or the output directory while that one is to be created)
  // lies on has less free room than the final weights of `model` take: a
  // job learnt it only after its last step (a full volume shared with the
  // state and the checkpoints). At submit only, and the checkpoints'
  // bytes are not counted: the room may still run out later.
  absl::Status CheckRoomForFinalWeights(const ConfinedParent& parent, const GptConfig& model) const;
  // CheckPaths: what spec.output.weights_path (`weights`, in `parent`)
  // names, when it exists, must be a regular file (INVALID_ARGUMENT: a
  // FIFO, socket or device, which the final rename refuses after every
  // step ran), and the directory it goes into, or, while directories on
  // the way are still to be made, the deepest existing one, writable by the
  // coordinator (EACCES, EROFS, EPERM: PERMISSION_DENIED, which CheckPaths
  // answers FAILED_PRECONDITION; ENOSYS: not told).
  absl::Status CheckWeightsNameReplaceable(const ConfinedParent& parent,
                                           const std::string& weights) const;
  // CheckPaths' first check: a job that writes weights or checkpoints
  // needs options_.output_dir (INVALID_ARGUMENT naming the field). Also
  // at Restore: a coordinator restarted without --output-dir fails such
  // jobs there, rather than at their end, after every step ran.
  absl::Status CheckOutputDirGiven(const ResolvedJobSpec& resolved) const;
  // spec.init.from: the checkpoint or weights file it names, checked
  // against the job's model (INVALID_ARGUMENT naming the field otherwise).
  // What keeps the coordinator from reading it is not the path's fault:
  // FAILED_PRECONDITION (EACCES, the operator's to fix) or UNAVAILABLE
  // (EMFILE, ENOMEM: retry), as CheckPaths answers them.
  struct InitSource {
    std::optional<v1::ResumeFrom> checkpoint;
    std::string weights;
  };
  absl::StatusOr<InitSource> ResolveInit(const ResolvedJobSpec& resolved) const;
  // INVALID_ARGUMENT when spec.checkpoint.dir holds a complete checkpoint
  // (an ended job's: live ones are refused under the lock) of a step after
  // the one this job starts from: its step-N directory would take this
  // job's files one by one, leaving neither checkpoint whole, and this
  // job's sweeps would delete it. Fails closed when it cannot list the
  // directory: FAILED_PRECONDITION (EACCES), else UNAVAILABLE.
  absl::Status CheckNoLaterCheckpoints(const ResolvedJobSpec& resolved,
                                       const InitSource& init) const;
  // What record's weights file will hold: spec.output.weights_path under
  // the output directory, every tensor the upload carries (weight_owner)
  // in the model's unit order.
  std::shared_ptr<WeightsFileCreation> NewWeightsFileCreationLocked(const JobRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the file of `creation` (confined, directories created) once,
  // whichever upload calls first; the others wait for it. Off mu_. The
  // file, or why it could not be created.
  absl::StatusOr<std::shared_ptr<SafetensorsFileWriter>> CreateWeightsFile(
      WeightsFileCreation& creation) const ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the job's weights file (its temporary is removed) and progress.
  static void DropWeightsFile(JobRecord& record);
  // Sends `worker` a STOP of the job, unless it is another job's by now.
  void StopWorkerLocked(const JobRecord& record, const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK while the job is RUNNING (its stages upload their weights); else
  // FAILED_PRECONDITION: a stopped plan's stage uploading late.
  absl::Status CheckUploadingLocked(const JobRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the temporaries of the job's weights path that coordinators
  // left when they died during its upload, logging each (safetensors.h:
  // RemoveAbandonedTemporaries); for a job that failed or was cancelled.
  // On the io_ queue: a directory listing on a slow file system must not
  // hold up the manager.
  void RemoveAbandonedWeightsOf(const JobRecord& record);
  // A weights sync task: syncs `file` off the lock, then renames it in
  // under the lock and the job SUCCEEDS (or FAILS saying why). A job that
  // ended (cancelled) before the sync is not synced, and one that ended by
  // the rename is not renamed in: `file`'s temporary goes with it. `path`
  // is what the job reports.
  void FinishWritingWeights(const std::string& job_id, const std::string& path,
                            SafetensorsFileWriter& file);
  // Hands `task` to the background runner (options.background_runner, or
  // background_). Requires !stopping_.
  void RunInBackgroundLocked(std::function<void()> task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for a finished job's weights file sync, on weights_sync_ by
  // default: behind it on background_, a recovery's re-plan (and every
  // first placement) waited for another job's fsync of gigabytes.
  void RunWeightsSyncLocked(std::function<void()> task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Both: `task` to options.background_runner, or else to `executor`,
  // counted in background_in_flight_.
  void RunOnLocked(SerialExecutor* executor, std::function<void()> task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops ended jobs beyond the retention options (those that ended
  // longest ago first), and the detail of those past the drawings' count.
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs, for a job being pruned, the expired checkpoints still listed
  // (record.expiring): given up, to be removed by hand.
  void WarnExpiringLeftLocked(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An ended job past max_ended_jobs_with_drawings keeps what its API
  // answers need (the job, the plan's numbers) and frees the rest: the
  // drawings, the compiled programs, the traces (so no measured timeline
  // either, as for a job restored after a restart).
  static void DropEndedJobDetail(JobRecord& record);
  void TouchLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops profiles the cache evicted (ProfileCache::Put) from the store.
  void DropStoredProfiles(const std::vector<std::string>& keys);
  // Saves the job to options_.state (no-op without one): committed on io_
  // in order, as the job is when the save runs (calls while one of the job
  // waits join it). Failures are logged, and an io_ save that
  // failed is tried again (RetryUnsavedLocked) until one of the job
  // succeeds. `then` (optional) runs after the save with its status (on
  // io_, off the lock; with OK at once on io_ without a store).
  absl::Status PersistLocked(JobRecord& record,
                             std::function<void(const absl::Status&)> then = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the directories of `dirs`, expired checkpoints of job `id` that
  // no stored state names as complete (on io_, off the lock), then drops
  // those removed from its `expiring` (and those that failed
  // kMaxExpiredRemovalTries times over kExpiredRemovalRetryFor, or whose
  // job was pruned meanwhile; the others stay, for RetryExpiringLocked).
  // Those no longer in `expiring` stay, and so do those tried since `dirs`
  // was taken (failed_removals changed): a step reported again since
  // (redone) writes into the same directory. Files modified after the
  // expired checkpoint's manifest stay too: a redo may have written them
  // and not reported yet.
  // `save_after`: then saves the job (a restart's removal: the stored state
  // lists them until a save).
  void RemoveExpiring(const std::string& id, const std::vector<ExpiredCheckpoint>& dirs,
                      bool save_after = false) ABSL_LOCKS_EXCLUDED(mu_);
  // The `files_before` of job `id`'s checkpoint `from`, dropped as unusable
  // (ExpiredCheckpoint.dropped_on_plan): read once from its files
  // (CheckpointFilesBound) while the job still runs the plan it was dropped
  // on, then kept in its `expiring` entry. InfinitePast (its unit files
  // stay) when they could not be read before a new plan, or the entry is
  // gone. On io_, off the lock.
  absl::Time DroppedFilesBound(const std::string& id, const v1::ResumeFrom& from)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What PersistLocked saves of `record` (it notes the time in
  // last_persisted).
  store::StoredJob StoredJobLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets record.profile and its cached JSON, record.profile_json (the one
  // place either is assigned, so they cannot disagree); counts the build in
  // profile_jsons_built_.
  void SetProfileLocked(JobRecord& record, ModelProfile profile) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // options_.state->SaveJob (which must be set), counting a failure
  // (events_.state_save_failed) and, with `log_failure`, logging it. Any
  // thread; no lock needed.
  absl::Status SaveStoredJob(const store::StoredJob& job, bool log_failure = true) const;
  // What Get and List show of `job`: SUCCEEDED or FAILED only once
  // saved. Until a save of its end succeeds (end_unsaved_: one in flight,
  // hung, or failing) it is shown RUNNING (QUEUED if never planned:
  // ShownStateLocked), with a reason saying the end waits for its save
  // ("finishing: ..." for a success, "ending: it failed (<why>) ..." for a
  // failure): a restart or failover meanwhile (a leader that lost etcd)
  // restores it as last saved (RUNNING, say) and runs it again.
  // A job without checkpoints then FAILED after a client was told it had
  // succeeded (`submit --follow` exited 0); one with checkpoints that had
  // failed (a stage's passing error, or too many recoveries: Restore
  // counts none) resumed from its last checkpoint and could succeed, after
  // clients were told it had failed and a cancel was refused. A cancel is
  // shown CANCELLED: Cancel answers UNAVAILABLE until it is saved.
  void ShowUnsavedEndLocked(v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `job` SUCCEEDED or FAILED and that end is not saved yet (shown
  // as not ended, ShownStateLocked; Cancel answers UNAVAILABLE).
  bool EndShownRunningLocked(const v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state Get, List, Summaries and CountByState show of `job`: its own,
  // but for an end not saved yet (EndShownRunningLocked) the state a
  // failover would restore: RUNNING, or QUEUED for a job never planned
  // (plan_version 0: a queue timeout, a first plan refused). That one ran
  // nothing, but is no more ended than the others: restored QUEUED, it is
  // placed as soon as workers are READY (before its queue timeout is
  // judged), so it holds its paths too.
  v1::JobState ShownStateLocked(const v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `job` has ended as other jobs' claims judge it (Submit's checks
  // of the paths it holds, its pending count, and pruning): terminal, and
  // its end saved. A failover before that save restores the job as last
  // saved (RUNNING, say): it runs again, writing its weights file and
  // checkpoint directory, and reloads what it started from, so no other
  // job may take them over yet. That holds for a cancel too, though it is
  // shown CANCELLED (CancelUnsavedLocked): a resubmit of the same spec
  // while the store fails is told to retry (UNAVAILABLE), not given the
  // files of a job that may yet run on.
  bool EndedForOthersLocked(const v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `job` was cancelled and no save of that end has succeeded yet.
  bool CancelUnsavedLocked(const v1::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that job `id`'s save on io_ failed with `status` (save_failures_),
  // and logs it: the first failure, then at most once a minute.
  void NoteFailedSaveLocked(const std::string& id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a failure in `stretch` (FailureStretch::Note); whether to log
  // it: also any as the job manager stops (its last try before a restart).
  bool NoteFailureLocked(FailureStretch& stretch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // options_.state->DeleteJob (which must be set), counting a failure
  // (events_.state_delete_failed). Any thread; no lock needed.
  absl::Status DeleteFromStore(const std::string& id) const;
  // Notes that job `id`'s delete from the store succeeded after failures
  // (delete_failures_), if any: returns " (after N failed deletes over D)",
  // else "".
  std::string NoteDeletedLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tries again the removals of expired checkpoints that failed
  // (RemoveExpiring), each once its kExpiredRemovalBackoff has passed, for
  // every job, ended ones included (nothing saves those again). Only those
  // a removal failed for: it ran after a save that no longer names them
  // (or for a restored list), which every later save keeps true. Not those
  // of an ended job whose checkpoint directory another job's overlaps (it
  // may have taken the directory over and written the same steps), nor
  // one a live job starts from (spec.init.from).
  void RetryExpiringLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Saves again, at most once a second, the jobs whose last save failed.
  void RetryUnsavedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On io_: deletes pruned job `id` from options_.state (which must be
  // set); a failure notes it in undeleted_, for RetryDeletesLocked, and in
  // delete_failures_ (logged: the first, then once a minute).
  void DeleteStoredJob(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes again, at most once a second, the pruned jobs whose delete
  // failed: else a restart would bring them back.
  void RetryDeletesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A complete checkpoint's manifest to write (WriteCheckpointManifest's
  // arguments).
  struct ManifestToWrite {
    std::string output_dir, job_id;
    v1::ModelSpec model;
    uint64_t seed = 0;
    v1::ResumeFrom complete;
    // Written just after its checkpoint completed and the save naming it
    // succeeded, the stages' reports of its files moments old. False for
    // one held by a failed save (written after a later one, possibly hours
    // on) and one a restore writes: their step may have been removed since.
    bool fresh = false;
  };
  // On io_: writes `m` while its job's catalog still holds the checkpoint
  // (one expired meanwhile gets none); a failure (a full disk) is logged
  // and noted in unwritten_manifests_, for RetryManifestsLocked: without
  // its manifest a complete checkpoint cannot be exported or named by
  // init.from. Logged as manifest_failures_ allows: the first failure,
  // then once a minute, and the write that succeeds after them. Only the
  // first try of a fresh `m` is unchecked and may create the step
  // directory; any other write (a retry, or `m` not fresh) never creates
  // it and writes only over the unit files `m` records (CheckUnitFiles: a
  // check that cannot tell, EIO or EMFILE, counts as a failed write); an
  // ended job's is not written once another job took its directory over
  // (OtherCheckpointDirUserLocked). Such a manifest, or one whose
  // directory is gone or files differ, is dropped (logged once, its
  // manifest_failures_ entry erased).
  void WriteManifestIfHeld(const ManifestToWrite& m) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes again, at most every 5 s, the manifests whose write failed.
  void RetryManifestsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes again from the store, at most once a second, the jobs Submit
  // left unsettled (on io_, off the lock), dropping each from submitting_
  // once its delete commits.
  void SettleSubmitsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The second sweep of ended jobs' checkpoint directories, for those whose
  // workers have stopped since (or kLateSweepWait after the end).
  void SweepStoppedJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the profile fetches to workers the registry lost or saw leave
  // (cancel_fetches_to_): their jobs profile again on another; and those
  // of jobs that ended meanwhile (their workers are held until the fetch
  // returns, for a profile nobody needs).
  void CancelAbandonedProfilesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WorkerRegistry* registry_;
  AssignmentHub* hub_;
  Clock* clock_;
  Clock* const elapsed_clock_;  // options_.elapsed_clock, or clock_
  const JobManagerOptions options_;
  mutable AnnotatedMutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t profile_jsons_built_ ABSL_GUARDED_BY(mu_) = 0;  // ProfileJsonsBuiltForTesting
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_ ABSL_GUARDED_BY(mu_);
  // By creation time (submission order), which strictly increases.
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  // The latest creation time given (or restored): the next is later.
  absl::Time last_create_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Jobs Submit is saving (off the lock): not in jobs_ until the store has
  // them, but their paths are claimed and they count as pending.
  std::map<std::string, std::unique_ptr<JobRecord>> submitting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
  ProfileFetcher fetcher_;                // set before use; read-only afterwards
  std::function<void()> cancel_fetches_;  // likewise; may be empty
  std::function<void(const std::string&)> cancel_fetches_to_;  // likewise; may be empty
  JobEvents events_;                                           // likewise
  ProfileCache profiles_;
  // Profile keys whose fetch ran past its deadline (the model takes longer
  // to profile there than the coordinator waits, which a later try would
  // too): until when (elapsed_clock_) their jobs plan on the analytic
  // profile without trying, and why. Each such job held every later one
  // (they wait while a job is profiled) for the whole deadline, then
  // planned on the analytic profile anyway. At most kMaxProfileTimeouts.
  // A key whose fetch ran past the deadline on one worker only is not
  // given up yet (that worker may be wedged: its device or profiler hung,
  // while it heartbeats READY): `worker` names it, and one other worker
  // of the kind tries (the job's retry, or a later job's) before the key
  // is given up (`worker` then empty).
  struct ProfileTimeout {
    absl::Time until;
    std::string error;
    std::string worker;
  };
  std::map<std::string, ProfileTimeout> profile_timeouts_ ABSL_GUARDED_BY(mu_);
  // Profile fetches in flight or done and not yet joined: a finished one is
  // joined when the next starts (ReapProfilersLocked), so a long-lived
  // coordinator holds no thread per profiled job.
  struct Profiler {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // set as the thread's last act
  };
  std::vector<Profiler> profilers_ ABSL_GUARDED_BY(mu_);
  // Guards drained_ alone: a leaf, taken by itself or after mu_. IsDrained
  // answers every worker heartbeat and must not wait for mu_, which a
  // placement on thousands of workers holds for seconds: a heartbeat
  // answered past the lease got a healthy worker marked LOST.
  mutable AnnotatedMutex drained_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // Drained workers: id -> the incarnation drained (a new one is not).
  std::map<std::string, int64_t> drained_ ABSL_GUARDED_BY(drained_mu_);
  // Background tasks handed to the runner and not finished.
  int background_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs whose latest save on io_ failed (the store was busy, full or
  // unreachable): saved again by RetryUnsavedLocked, not before this time.
  std::set<std::string> unsaved_ ABSL_GUARDED_BY(mu_);
  // Jobs whose latest save on io_ failed (unlike unsaved_, kept while the
  // retry waits; JobsWithFailedSave), and since when.
  std::map<std::string, FailureStretch> save_failures_ ABSL_GUARDED_BY(mu_);
  // Jobs that ended (with options.state; and every job Restore failed) and
  // no save of that end has succeeded yet. A success or failure is shown
  // RUNNING or QUEUED (ShowUnsavedEndLocked), not counted ended
  // (JobEvents::ended); a cancel is shown CANCELLED, and a repeated Cancel
  // saves again and waits (answered OK at once after). Each holds its
  // paths (EndedForOthersLocked) and is not pruned (PruneLocked).
  std::set<std::string> end_unsaved_ ABSL_GUARDED_BY(mu_);
  // Jobs with a save waiting on io_ (PersistLocked), and what runs after it.
  std::map<std::string, std::vector<std::function<void(const absl::Status&)>>> queued_saves_
      ABSL_GUARDED_BY(mu_);
  absl::Time next_save_retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_settle_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Pruned jobs whose store delete failed, deleted again by
  // RetryDeletesLocked not before next_delete_retry_.
  std::set<std::string> undeleted_ ABSL_GUARDED_BY(mu_);
  // Jobs whose latest delete from the store failed, kept while the retry
  // waits (JobsWithFailedDelete): pruned jobs (undeleted_) and unsettled
  // submits (SettleSubmitsLocked).
  std::map<std::string, FailureStretch> delete_failures_ ABSL_GUARDED_BY(mu_);
  absl::Time next_delete_retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Manifests whose write failed, written again by RetryManifestsLocked not
  // before next_manifest_retry_.
  std::vector<ManifestToWrite> unwritten_manifests_ ABSL_GUARDED_BY(mu_);
  // By (job id, step directory): manifests whose latest write failed,
  // until one succeeds or the catalog no longer holds the step.
  std::map<std::pair<std::string, std::string>, FailureStretch> manifest_failures_
      ABSL_GUARDED_BY(mu_);
  // By job: manifests of checkpoints whose save failed, written after the
  // job's next save that succeeds (PersistLocked): a manifest makes a
  // checkpoint directory look complete to tools and init.from, and the
  // stored state did not name it yet.
  std::map<std::string, std::vector<ManifestToWrite>> manifests_after_save_ ABSL_GUARDED_BY(mu_);
  absl::Time next_manifest_retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Set by the destructor: tasks still queued skip the planning.
  std::atomic<bool> planning_stopped_{false};
  // File and store work that must not hold mu_ (commits, manifests, expired
  // checkpoints), in order. Destroyed after background_, whose tasks may post
  // here, and before everything else, finishing its tasks while everything
  // they use exists.
  SerialExecutor io_{elapsed_clock_};  // its OldestTaskAge on the elapsed clock
  // The default background runner (null with options.background_runner);
  // reset first in the destructor.
  std::unique_ptr<SerialExecutor> background_;
  // Weights file syncs (RunWeightsSyncLocked); null, and reset, with
  // background_.
  std::unique_ptr<SerialExecutor> weights_sync_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_H_
