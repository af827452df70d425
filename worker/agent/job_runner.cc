#include "worker/agent/job_runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/confined_path.h"
#include "common/data_plane_keys.h"
#include "common/echo_input.h"
#include "common/errno_status.h"
#include "common/logging.h"
#include "common/rpc_status.h"
#include "common/safetensors.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "common/utf8_prefix.h"
#include "spec/job_spec.h"
#include "worker/agent/step_tracing.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/data/corpus.h"
#include "worker/model/gpt_config.h"
#include "worker/model/weights_io.h"
#include "worker/train/divergence.h"

namespace pipetrain {

absl::Duration ReportRetryForLease(absl::Duration lease, absl::Duration heartbeat_interval) {
  const absl::Duration least = absl::Seconds(60), most = absl::Hours(24);
  // Either may be anything a coordinator sent (or infinite): compared,
  // never summed past `most`.
  if (!(lease > absl::ZeroDuration()) || !(heartbeat_interval >= absl::ZeroDuration())) {
    return least;
  }
  if (lease >= most || heartbeat_interval >= most - lease) return most;
  return std::max(least, lease + heartbeat_interval);
}

BackoffOptions ReportRetryBackoff(const JobRunnerOptions& options) {
  return BackoffOptions{options.report_retry_backoff, options.report_retry_backoff * 8, 2.0,
                        options.retry_jitter, options.retry_seed};
}

absl::Duration StartBarrierPollDelay(absl::Duration waited, uint64_t seed, uint32_t poll,
                                     double jitter) {
  const absl::Duration base = std::clamp(waited / 10, absl::Milliseconds(20), absl::Seconds(1));
  return base * BackoffJitterFactor(seed, poll, jitter);
}

int AssignmentWorkerCount(const v1::Assignment& a) {
  return std::max(1, a.replicas()) * a.num_stages() * std::max(1, a.tensor_parallel());
}

int GlobalWorkerIndex(const v1::Assignment& a) {
  return (a.replica() * a.num_stages() + a.stage()) * std::max(1, a.tensor_parallel()) +
         a.tensor_rank();
}

std::string ReportableError(const absl::Status& status) {
  // The coordinator refuses error texts over 16 KiB; a reason stays readable.
  // UTF-8, and cut on a character boundary: a report's error is a proto
  // string, which the coordinator refuses to parse unless it is UTF-8 (the
  // report, and the failure it tells, would be lost), and the error may
  // quote a peer's gRPC status or a path with any bytes (a checkpoint
  // root's name). Without payloads: an errno a helper attached is for code,
  // and would end the job's reason as "[type.pipetrain/errno='28']".
  std::string text = ValidUtf8(StatusTextForUsers(status));
  if (text.size() > 4096) text = absl::StrCat(Utf8Prefix(text, 4096), " [...]");
  return text;
}

namespace {

// Errors of the data plane: a peer that went away or stopped answering. A
// job with checkpoints recovers from them (the peer is probably gone), and
// from a failed device (ReportError); anything else (a bad program) fails
// it.
bool IsPeerFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded ||
         status.code() == absl::StatusCode::kAborted;
}

// Whether a failed resume load says the checkpoint itself is bad (a file
// missing, short, corrupt, or another model's), which the coordinator may
// answer by dropping it, not this worker's access to it: an I/O error
// (UNAVAILABLE, which is a peer failure: the job recovers and tries the
// same checkpoint again), too many open files, permissions. A good
// checkpoint dropped for one worker's trouble cost the job every step since
// the one before (with keep 1, the whole run). Nor is a file another build
// wrote in a form this one does not read (UNIMPLEMENTED: ReadUnitCheckpoint):
// dropped, it was deleted, and with it the job's way back on a rollback.
bool CheckpointItselfUnusable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:  // another model's
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return true;
    case absl::StatusCode::kUnimplemented:  // another build's format: kept
    default:
      return false;
  }
}

// The job's error for a checkpoint refused because the stage's state is
// not finite (`refused`: IsSnapshotNotFinite, naming the step and tensor).
absl::Status DivergedAtCheckpoint(const absl::Status& refused) {
  return absl::FailedPreconditionError(
      absl::StrCat("training diverged: ", refused.message(),
                   "; try a lower learning rate, a warm-up or gradient clipping"));
}

// The coordinator's answer to a report of a job that has ended meanwhile
// (JobManager::ForWorkerLocked: "job J already ended (STATE)"): a cancel
// that reached the coordinator before this stage's first report. Nothing
// failed here, and there is nobody left to tell.
bool JobAlreadyEnded(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(status.message(), " already ended (");
}

// The coordinator's refusal of a report whose incarnation is not that of
// the session credential it carries (grpc_service.cc,
// CheckReportIncarnation: "report of a stale job runner"): this runner
// belongs to an incarnation the worker has registered past. Nothing failed
// here, and the coordinator would refuse an error report alike.
bool StaleRunnerRefused(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(status.message(), "report of a stale job runner");
}

}  // namespace

std::string DataPlaneJobId(const v1::Assignment& assignment) {
  return DataPlaneJobId(assignment.job_id(), assignment.plan_version());
}

absl::Status CheckDataPlaneKeys(const v1::Assignment& a) {
  // Bounded by CheckAssignmentLayout (which the callers run first).
  const int workers = AssignmentWorkerCount(a);
  if (a.data_plane_receive_key().empty() && a.data_plane_send_keys_size() == 0) {
    return absl::FailedPreconditionError(
        "the assignment carries no data-plane keys; not running it (is the coordinator older "
        "than this worker?)");
  }
  bool sized = a.data_plane_receive_key().size() == kDataPlaneKeyBytes &&
               a.data_plane_send_keys_size() == workers;
  for (const std::string& key : a.data_plane_send_keys()) {
    sized = sized && key.size() == kDataPlaneKeyBytes;
  }
  if (sized) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the assignment's data-plane keys are malformed (want a ", kDataPlaneKeyBytes,
                   "-byte receive key and one send key of that size per worker, ", workers,
                   "; got a receive key of ", a.data_plane_receive_key().size(), " bytes and ",
                   a.data_plane_send_keys_size(), " send keys); not running it"));
}

absl::Status CheckAssignmentLayout(const v1::Assignment& a) {
  // Each factor on its own first: a product of unbounded ones can wrap
  // (2^21 x 2^21 x 2^22 is 0 in int64) and then match any peer count.
  const auto in_range = [](const char* field, int64_t value, int64_t min, int64_t max) {
    if (value >= min && value <= max) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: ", field, " ", value, " is out of range [", min, ", ", max, "]"));
  };
  RETURN_IF_ERROR(in_range("num_stages", a.num_stages(), 1, kMaxStages));
  RETURN_IF_ERROR(in_range("replicas", a.replicas(), 0, kMaxStages));  // 0: unset, 1
  RETURN_IF_ERROR(in_range("tensor_parallel", a.tensor_parallel(), 0, kMaxTensorParallel));
  // Now at most 2^26: no overflow. A spec allows kMaxStages workers in all.
  const int replicas = std::max(1, a.replicas());
  const int tensor = std::max(1, a.tensor_parallel());
  const int workers = AssignmentWorkerCount(a);
  if (workers > kMaxStages) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: ", replicas, " replicas x ", a.num_stages(), " stages x ", tensor,
                     " tensor ranks is ", workers, " workers; at most ", kMaxStages));
  }
  // The coordinator lists every worker's address (plan.proto), and the data
  // plane's transport needs this worker's among them (GrpcTransport CHECKs
  // it): an empty list is refused as well as a short one.
  if (a.replica() < 0 || a.replica() >= replicas || a.stage() < 0 || a.stage() >= a.num_stages() ||
      a.tensor_rank() < 0 || a.tensor_rank() >= tensor || workers != a.peer_addresses_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment: stage ", a.stage(), " of ", a.num_stages(), ", replica ", a.replica(), " of ",
        replicas, ", tensor rank ", a.tensor_rank(), " of ", tensor, ", with ",
        a.peer_addresses_size(), " peer addresses (want replicas x stages x tensor ranks)"));
  }
  return absl::OkStatus();
}

absl::Status CheckStartIteration(const v1::Assignment& a, int64_t steps) {
  // steps is the assignment's spec, not yet resolved (ResolveJobSpec bounds
  // it later): unbounded, a start just below INT64_MAX passed, and the
  // mailbox's run-ahead window was opened there.
  if (steps < 1 || steps > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: spec.training.steps ", steps,
                                                   " is out of range [1, ", kMaxSteps, "]"));
  }
  const int64_t start = a.start_iteration();
  if (start < 0 || start >= steps) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: start_iteration ", start,
                                                   " is out of range [0, ", steps,
                                                   ") (spec.training.steps ", steps, ")"));
  }
  // The checkpoint's files say which step they hold (ReadUnitCheckpoint
  // checks their "step" against resume.step): the iterations run must be
  // the ones after it.
  if (a.has_resume() && a.resume().step() != start) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: start_iteration ", start, " but resume.step ", a.resume().step(),
                     "; a resumed job starts at its checkpoint's step"));
  }
  return absl::OkStatus();
}

JobRunner::JobRunner(v1::Assignment assignment, Mailbox* mailbox, TransportFactory make_transport,
                     CoordinatorLink* coordinator, JobRunnerOptions options,
                     IterationObserver observer)
    : assignment_(std::move(assignment)),
      mailbox_(mailbox),
      make_transport_(std::move(make_transport)),
      coordinator_(coordinator),
      options_(std::move(options)),
      observer_(std::move(observer)),
      data_plane_job_(DataPlaneJobId(assignment_)) {}

JobRunner::~JobRunner() { Stop(); }

void JobRunner::Start() {
  thread_ = std::thread([this] { Run(); });
}

void JobRunner::Stop() {
  stop_.store(true);
  // gRPC's flow control holds an upload to a coordinator whose host
  // vanished for up to its 10-minute deadline, and the thread joined below
  // makes it.
  upload_cancel_.Cancel();
  mailbox_->AbortJob(data_plane_job_);
  {
    // A completed job's sends may still be on their way to its peers.
    AnnotatedMutexLock lock(&mu_);
    if (device_channel_ != nullptr && !completed_.load()) device_channel_->Abort();
    if (replica_collective_ != nullptr && !completed_.load()) replica_collective_->Abort();
    if (transport_ != nullptr && !completed_.load()) transport_->Abort();
  }
  if (thread_.joinable()) thread_.join();
}

std::string JobRunner::current_instruction() const {
  AnnotatedMutexLock lock(&mu_);
  if (runtime_ == nullptr) {
    // Heartbeats carry this: a runner stuck reporting a failure to an
    // unreachable coordinator, or closing its links, must not look as if
    // it were starting.
    if (finished_.load()) return "idle";
    return ending_.load() ? "ending: closing the job's links and reporting its result" : "starting";
  }
  return runtime_->current_instruction();
}

void JobRunner::Run() {
  absl::Status status = RunJob();
  ending_.store(true);
  if (!status.ok() && !stop_.load() && !reported_) {
    if (JobAlreadyEnded(status)) {
      PT_LOG(INFO) << "job " << assignment_.job_id() << " ended at the coordinator before this "
                   << "stage finished (" << status.message() << "); stopping";
    } else if (StaleRunnerRefused(status)) {
      PT_LOG(INFO) << "job " << assignment_.job_id() << ": this runner is of incarnation "
                   << options_.incarnation << ", which this worker has registered past ("
                   << status.message() << "); stopping this stage, not reporting it";
    } else if (session_refused_.load()) {
      // After every coordinator restart: not this stage's failure, and not
      // one the coordinator would take (the job re-plans once the worker
      // has registered again).
      PT_LOG(WARNING) << "job " << assignment_.job_id() << ": the coordinator no longer accepts "
                      << "this worker's session (" << status.message()
                      << "); stopping this stage, not reporting it";
    } else {
      ReportError(status);
    }
  }
  const absl::Status backend = options_.backend->status();
  if (!backend.ok() && options_.on_backend_failure) options_.on_backend_failure(backend);
  finished_.store(true);
}

void JobRunner::ReportError(const absl::Status& status, bool checkpoint_unusable) {
  reported_ = true;
  PT_LOG(ERROR) << "job " << assignment_.job_id() << " failed on this worker: " << status;
  v1::ReportProgressRequest r;
  r.set_worker_id(options_.worker_id);
  r.set_incarnation(options_.incarnation);
  r.set_job_id(assignment_.job_id());
  r.set_plan_version(assignment_.plan_version());
  r.set_error(ReportableError(status));
  // A failed device (CUDA errors stick: Backend::status) is recovered from
  // as a lost peer is: this worker exits to be restarted with a fresh
  // context (on_backend_failure), and a job with checkpoints goes on
  // without it, as it would had the process crashed; a fault that repeats
  // still ends the job at the recovery limit.
  const bool device_failed = !options_.backend->status().ok();
  // The final weights upload failing UNAVAILABLE past the retries (a
  // coordinator short of descriptors or memory answers so for as long as
  // that lasts: job_manager_weights.cc) is a peer failure too: a job with
  // checkpoints recovers and uploads again, redoing up to a checkpoint
  // interval of steps, as its owner would by hand from the last one.
  r.set_peer_failure(IsPeerFailure(status) || device_failed);
  r.set_checkpoint_unusable(checkpoint_unusable);
  // Retried: a failure the coordinator never hears of leaves the job
  // waiting until the other stages time out.
  absl::Status sent = ReportWithRetries(r).status();
  if (!sent.ok()) PT_LOG(ERROR) << "could not report the failure: " << sent;
}

absl::Status JobRunner::AwaitAllStagesReady() {
  v1::ReportProgressRequest r;
  r.set_worker_id(options_.worker_id);
  r.set_incarnation(options_.incarnation);
  r.set_job_id(assignment_.job_id());
  r.set_plan_version(assignment_.plan_version());
  r.set_ready(true);
  r.set_resume_load_seconds(resume_load_seconds_);
  r.set_data_sha256(data_sha256_);
  // Not the data plane's receive timeout: the stages load their data and
  // read their checkpoints or starting weights before the barrier (a
  // device or replica group member too: it passes the barrier before it
  // joins its group, and restores what it read only then), and one that
  // loads a large stage, or from a slower mount, may come minutes after
  // the others (each tensor rank reads and hashes its stage's unit files
  // whole). A stage given up here was a peer failure, the recovery loaded
  // the same checkpoint with the same gap, and the job failed at its
  // recovery limit, blaming the fast stage; so did a group member's load
  // when it came after the barrier, where a peer's first step waits for
  // it only one receive timeout. A dead peer does not wait this out:
  // the coordinator sees its stream end (or its lease lapse), recovers,
  // and this runner is stopped.
  const absl::Duration wait = std::max(options_.recv_timeout, kMinStartBarrierWait);
  const absl::Time start = MonotonicClock()->Now();
  const absl::Time deadline = start + wait;
  // Polls the coordinator's barrier: at once (the last stage to come is
  // answered then), then StartBarrierPollDelay apart, so that many workers
  // waiting long do not flood the coordinator.
  for (uint32_t poll = 0; !stop_.load(); ++poll) {
    // A brief outage (a leader change) must not end the stage here either.
    ASSIGN_OR_RETURN(v1::ReportProgressResponse response, ReportWithRetries(r));
    if (response.all_ready()) return absl::OkStatus();
    const absl::Time now = MonotonicClock()->Now();
    if (now > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the other stages of job ", assignment_.job_id(), " were not ready within ",
                       absl::FormatDuration(wait), "; check the other workers' logs"));
    }
    SleepUnlessStopped(
        StartBarrierPollDelay(now - start, options_.retry_seed, poll, options_.retry_jitter));
  }
  return absl::CancelledError("stopped at the start barrier");
}

absl::StatusOr<std::unique_ptr<DeviceChannel>> JobRunner::JoinDeviceGroup() {
  const v1::DeviceGroup& proto = assignment_.device_group();
  DeviceGroupSpec group{proto.nccl_unique_id(), {proto.stages().begin(), proto.stages().end()}, {}};
  for (const v1::DeviceLink& link : proto.links()) {
    group.links.push_back({link.from_stage(), link.to_stage()});
  }
  // The others passed the start barrier too: wait for them as long as for a
  // tensor, and not past a stop.
  group.join_deadline = MonotonicClock()->Now() + options_.recv_timeout;
  group.join_cancelled = [this] { return stop_.load(); };
  // And at the end, for our last sends to be taken.
  group.drain_timeout = options_.recv_timeout;
  int device_sends = 0, device_recvs = 0;
  for (const v1::Instruction& in : assignment_.program().instructions()) {
    device_sends += in.has_send() && in.send().path() == v1::LINK_PATH_DEVICE;
    device_recvs += in.has_recv() && in.recv().path() == v1::LINK_PATH_DEVICE;
  }
  // Members are numbered by worker (with replicas, replica r's stage s is
  // r * num_stages + s), as the runtime addresses the channel's peers.
  const int member = GlobalWorkerIndex(assignment_);
  const std::string what = absl::StrCat("stage ", member, " joining device group [",
                                        absl::StrJoin(group.stages, ", "), "]");
  PT_LOG(INFO) << what << " on " << options_.backend->Describe();
  absl::StatusOr<std::unique_ptr<DeviceChannel>> channel =
      options_.backend->JoinDeviceGroup(group, member);
  if (!channel.ok()) {
    return absl::Status(channel.status().code(),
                        absl::StrCat(what, ": ", channel.status().message()));
  }
  PT_LOG(INFO) << what << ": joined; " << device_sends << " sends and " << device_recvs
               << " receives per iteration go device to device";
  return channel;
}

absl::StatusOr<std::unique_ptr<DeviceCollective>> JobRunner::JoinReplicaGroup() {
  const v1::ReplicaDeviceGroup& proto = assignment_.replica_device_group();
  // The runtime's sums cover every replica: a group of fewer would train
  // the others' gradients wrongly.
  const int replicas = assignment_.replicas();
  bool every = proto.replicas_size() == replicas;
  for (int r = 0; every && r < replicas; ++r) every = proto.replicas(r) == r;
  if (!every) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: replica_device_group lists ",
                                                   proto.replicas_size(), " replicas; want 0 .. ",
                                                   replicas - 1, " in order"));
  }
  DeviceCollectiveSpec spec;
  spec.id = proto.nccl_unique_id();
  spec.members = replicas;
  spec.rank = assignment_.replica();
  // As JoinDeviceGroup: as long as for a tensor, not past a stop, and at
  // the end as long for the last sums.
  spec.join_deadline = MonotonicClock()->Now() + options_.recv_timeout;
  spec.join_cancelled = [this] { return stop_.load(); };
  spec.drain_timeout = options_.recv_timeout;
  const std::string what =
      absl::StrCat("stage ", assignment_.stage(), " of replica ", assignment_.replica(),
                   " joining its ", replicas, " replicas' device group");
  PT_LOG(INFO) << what << " on " << options_.backend->Describe();
  absl::StatusOr<std::unique_ptr<DeviceCollective>> collective =
      options_.backend->JoinDeviceCollective(spec);
  if (!collective.ok()) {
    return absl::Status(collective.status().code(),
                        absl::StrCat(what, ": ", collective.status().message()));
  }
  PT_LOG(INFO) << what << ": joined; its exact gradient sums run on the device";
  return collective;
}

absl::Status JobRunner::CheckCheckpointRootReachable() const {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        "the job resumes from a checkpoint, but this worker was started without "
        "--checkpoint-root (the coordinator's --output-dir, shared)");
  }
  const int fd = open(options_.checkpoint_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    return absl::UnavailableError(absl::StrCat(
        "cannot open --checkpoint-root ", options_.checkpoint_root, ": ", std::strerror(error)));
  }
  close(fd);
  return absl::OkStatus();
}

absl::StatusOr<JobRunner::ReadUnits> JobRunner::ReadResume(const CheckpointIdentity& identity) {
  const v1::ResumeFrom& from = assignment_.resume();
  std::map<int, const v1::UnitFile*> files;
  for (const v1::UnitFile& f : from.units()) files[f.unit()] = &f;
  std::set<int> units;
  for (const v1::UnitRange& r : {assignment_.forward_units(), assignment_.backward_units()}) {
    for (int u = r.begin(); u < r.end(); ++u) units.insert(u);
  }
  const v1::UnitRange& backward = assignment_.backward_units();
  ReadUnits read;
  read.source = from.dir();
  int64_t optimizer_steps = -1;
  for (int u : units) {
    auto f = files.find(u);
    if (f == files.end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", from.dir(), " has no file for unit ", u));
    }
    // A Stop waits for this thread: not for the rest of a large checkpoint.
    if (stop_.load()) return absl::CancelledError("stopped while loading the checkpoint");
    const bool owned = u >= backward.begin() && u < backward.end();
    int64_t steps = 0;
    // Only this replica's share of the old replicas' residuals (those
    // Restore folds into it) and, for a forward-only unit, its weights
    // alone: decoding every tensor was not budgeted (unit_checkpoint.h).
    ASSIGN_OR_RETURN(UnitState state,
                     ReadUnitCheckpoint(options_.checkpoint_root, from, *f->second, identity,
                                        /*with_moments=*/owned, &steps, assignment_.replica(),
                                        std::max(1, assignment_.replicas())));
    if (owned) {
      if (optimizer_steps >= 0 && steps != optimizer_steps) {
        return absl::DataLossError(absl::StrCat("checkpoint ", from.dir(),
                                                ": units disagree on the optimizer step (",
                                                optimizer_steps, " and ", steps, ")"));
      }
      optimizer_steps = steps;
    }
    read.states.push_back(std::move(state));
  }
  read.optimizer_steps = std::max<int64_t>(optimizer_steps, 0);
  return read;
}

absl::Status JobRunner::RestoreResume(StageRuntime& runtime, const ReadUnits& read) {
  absl::Status restored = runtime.Restore(read.states, read.optimizer_steps);
  // Restore's own refusals (INVALID_ARGUMENT: states that do not fit this
  // stage) are the checkpoint's; anything else is the device's (an
  // allocation that failed), kept as it is, so that it is not taken for
  // the checkpoint's fault.
  if (restored.code() == absl::StatusCode::kInvalidArgument) {
    return absl::DataLossError(restored.message());
  }
  RETURN_IF_ERROR(restored);
  size_t feedback_replicas = 0;  // of a compressed all-reduce (unit_checkpoint.h)
  for (const UnitState& s : read.states) {
    feedback_replicas = std::max(feedback_replicas, s.feedback.size());
  }
  PT_LOG(INFO) << "job " << assignment_.job_id() << " stage " << assignment_.stage() << ": loaded "
               << read.states.size() << " units from " << read.source
               << (feedback_replicas > 0
                       ? absl::StrCat(", with the error feedback of ", feedback_replicas,
                                      feedback_replicas == 1 ? " replica" : " replicas")
                       : "");
  return absl::OkStatus();
}

absl::StatusOr<JobRunner::ReadUnits> JobRunner::ReadInitWeights(const GptConfig& model) {
  ASSIGN_OR_RETURN(const std::string path,
                   ResolveUnderRoots("spec.init.from", assignment_.init_weights(),
                                     {options_.checkpoint_root}, "--checkpoint-root"));
  std::set<int> units;
  for (const v1::UnitRange& r : {assignment_.forward_units(), assignment_.backward_units()}) {
    for (int u = r.begin(); u < r.end(); ++u) units.insert(u);
  }
  // This stage's tensors alone: every stage reading and converting the
  // whole file cost each worker the model's size, twice.
  std::vector<std::string> names;
  for (int u : units) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) names.push_back(p.name);
  }
  // Opened following no link: one swapped in after the root check (a
  // directory on the way replaced by a link out of the root) is refused,
  // not read, as spec.data.path's is.
  ASSIGN_OR_RETURN(ScopedFd file, OpenRealPathNoLinks("spec.init.from", path));
  ASSIGN_OR_RETURN(SafetensorsContents contents,
                   ReadParameterTensors(path, names, std::move(file)));
  ReadUnits read;
  read.source = path;
  for (int u : units) {
    UnitState state;
    state.unit = u;
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      absl::StatusOr<const Tensor*> found = FindParameterTensor(contents, p.name);
      if (!found.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", found.status().message()));
      }
      const Tensor* t = *found;
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", p.name));
      }
      // A padded vocabulary takes the file's rows (weights_io.h).
      absl::StatusOr<Tensor> fitted =
          FitToParameter(p.name, Shape(p.shape.begin(), p.shape.end()), *t);
      if (!fitted.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", fitted.status().message()));
      }
      if (absl::Status finite = CheckStartingWeightsFinite(p.name, *fitted); !finite.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", finite.message()));
      }
      state.values.push_back({p.name, *std::move(fitted)});
    }
    read.states.push_back(std::move(state));
  }
  return read;
}

absl::StatusOr<v1::ReportProgressResponse> JobRunner::ReportWithRetries(
    const v1::ReportProgressRequest& r) {
  absl::StatusOr<v1::ReportProgressResponse> reported;
  const std::string what =
      r.has_checkpoint()
          ? absl::StrCat("the report of the checkpoint of step ", r.checkpoint().step())
          : absl::StrCat("the report of iteration ", r.iteration());
  RetryWhileOutcomeUnknown(what, [&] {
    reported = coordinator_->ReportProgress(r);
    return reported.status();
  }).IgnoreError();  // the same status as `reported`'s
  return reported;
}

absl::Status JobRunner::UploadWeightsWithRetries(const std::vector<Parameter*>& params) {
  return RetryWhileOutcomeUnknown("the weights upload", [&] {
    return coordinator_->UploadWeights(assignment_.job_id(), params, &upload_cancel_);
  });
}

absl::Status JobRunner::RetryWhileOutcomeUnknown(const std::string& what,
                                                 const std::function<absl::Status()>& attempt) {
  // Jittered: every stage of a job reports at the same step boundary, and
  // those that lost the coordinator together must not all retry at once.
  Backoff backoff(ReportRetryBackoff(options_));
  std::optional<absl::Time> give_up;  // set at the first failure
  while (true) {
    const absl::Status status = attempt();
    if (!give_up.has_value()) give_up = MonotonicClock()->Now() + options_.report_retry_for;
    if (status.code() == absl::StatusCode::kUnauthenticated) session_refused_.store(true);
    if (status.ok() || !OutcomeUnknown(status) || stop_.load()) return status;
    const absl::Duration wait = backoff.Next();
    if (MonotonicClock()->Now() + wait > *give_up) return status;
    PT_LOG(WARNING) << "job " << assignment_.job_id() << ": " << what << " failed (" << status
                    << "); again in " << absl::FormatDuration(wait);
    SleepUnlessStopped(wait);
  }
}

void JobRunner::SleepUnlessStopped(absl::Duration wait) const {
  const absl::Time until = MonotonicClock()->Now() + wait;
  while (!stop_.load() && MonotonicClock()->Now() < until) {
    absl::SleepFor(std::min(until - MonotonicClock()->Now(), absl::Milliseconds(20)));
  }
}

void JobRunner::ReportCheckpoint(int64_t step, double seconds,
                                 const absl::StatusOr<std::vector<v1::UnitFile>>& files) {
  v1::ReportProgressRequest r;
  r.set_worker_id(options_.worker_id);
  r.set_incarnation(options_.incarnation);
  r.set_job_id(assignment_.job_id());
  r.set_plan_version(assignment_.plan_version());
  r.set_iteration(step - 1);
  r.set_busy_seconds(0);
  v1::CheckpointWritten* c = r.mutable_checkpoint();
  c->set_step(step);
  c->set_write_seconds(seconds);
  if (files.ok()) {
    for (const v1::UnitFile& f : *files) *c->add_units() = f;
    PT_LOG(INFO) << "job " << assignment_.job_id() << ": checkpoint of step " << step
                 << " written (" << files->size() << " units, " << seconds << " s)";
  } else if (stop_.load()) {
    // A write that outlived the job: the coordinator removes the step
    // directories of an ended job, so failing here is the expected end.
    PT_LOG(INFO) << "job " << assignment_.job_id() << ": checkpoint of step " << step
                 << " not written, the job having stopped (" << files.status() << ")";
  } else if (IsSnapshotNotFinite(files.status())) {
    // Refused for state that is not finite: every later checkpoint would be
    // refused too while training went on (an AdamW second moment that
    // overflowed leaves the weights and the loss finite, so no loss stops
    // it), and a recovery would replay the spike. The runner's thread fails
    // the job, as train-local ends at this checkpoint. Not reported as the
    // checkpoint's write error: at a drain's or join's step boundary the
    // coordinator recovers from that ("checkpoint_failed", from the
    // checkpoint before), drops the "training diverged" that follows (the
    // job is RECOVERING by then) and may train on past the divergence.
    PT_LOG(ERROR) << "job " << assignment_.job_id() << ": checkpoint of step " << step
                  << " refused, the stage's state not being finite (" << files.status()
                  << "); the job fails as diverged";
    AnnotatedMutexLock lock(&mu_);
    if (checkpoint_diverged_.ok()) checkpoint_diverged_ = DivergedAtCheckpoint(files.status());
    return;
  } else {
    PT_LOG(ERROR) << "job " << assignment_.job_id() << ": checkpoint of step " << step
                  << " failed: " << files.status();
    c->set_error(ReportableError(files.status()));
  }
  // Retried as an iteration's. A job re-planning at a step boundary waits
  // for every stage's report of the boundary's checkpoint, and nothing else
  // ends that wait (no stage waits for a peer there, and an outage shorter
  // than the lease loses no worker): that report is sent again until it is
  // answered or the job stops this runner (the coordinator takes a repeat
  // of the same files as recorded).
  const bool boundary = step == boundary_step_.load();
  absl::Status sent = ReportWithRetries(r).status();
  while (boundary && !sent.ok() && OutcomeUnknown(sent) && !stop_.load()) {
    PT_LOG(WARNING) << "job " << assignment_.job_id() << ": the report of the boundary's checkpoint"
                    << " of step " << step << " still failed (" << sent
                    << "); sent again until answered or stopped";
    sent = ReportWithRetries(r).status();
  }
  if (!sent.ok() && !stop_.load()) PT_LOG(WARNING) << "could not report the checkpoint: " << sent;
}

absl::Status JobRunner::CheckpointDiverged() const {
  AnnotatedMutexLock lock(&mu_);
  return checkpoint_diverged_;
}

namespace {

// Assignment.host_memory_budget_bytes as a whole number of bytes; 0 when
// it is unset or not in [1, 2^62] (unbounded: no share).
int64_t HostMemoryShare(const v1::Assignment& a) {
  const double budget = a.host_memory_budget_bytes();
  if (!(budget >= 1 && budget <= 0x1p62)) return 0;
  return static_cast<int64_t>(budget);
}

// ReportProgressRequest.weights_digest: SHA-256 of every parameter's fp32
// bytes, in parameters() order (`host`: HostParameterCopies of them).
// Hashed in place, piece by piece: a copy of every weight in one string
// (twice the stage's weights while it grows) on every replica at once at
// the job's last step could take a worker past its memory.
std::string WeightsDigest(const std::vector<Parameter>& host) {
  std::vector<absl::string_view> pieces;
  pieces.reserve(host.size());
  for (const Parameter& p : host) {
    pieces.emplace_back(reinterpret_cast<const char*>(p.value.data()), p.value.size_bytes());
  }
  return Sha256HexOfPieces(pieces);
}

}  // namespace

absl::Status JobRunner::RunJob() {
  ASSIGN_OR_RETURN(ResolvedJobSpec job, ResolveJobSpec(assignment_.spec()));
  // Data and tensor parallelism: the transport numbers every worker of
  // the job (Assignment.replica, .tensor_rank); checked first, before
  // anything is sized from it or the corpus is loaded.
  RETURN_IF_ERROR(CheckAssignmentLayout(assignment_));
  RETURN_IF_ERROR(CheckDataPlaneKeys(assignment_));
  RETURN_IF_ERROR(CheckStartIteration(assignment_, job.train.steps));
  std::string data_path = job.spec.data().path();
  if (!data_path.empty()) {
    ASSIGN_OR_RETURN(data_path,
                     ResolveUnderRoots("spec.data.path", data_path, options_.data_roots));
  }
  CorpusSpec corpus{data_path, job.data_format, job.train.model.vocab_size, job.synthetic_bytes,
                    job.train.seed};
  // Read through the real path, but take the format from the name the spec
  // gave, as `train-local --data` does: a link "train.bin" to a hash-named
  // file is uint16, not text (pipeline == train-local).
  corpus.name = job.spec.data().path();
  // Checked under the data roots just now: no link swapped in since is
  // followed out of them.
  corpus.path_is_checked_real = !data_path.empty();
  // Text peaks at 3x its file (the bytes, then a 2-byte token each), and
  // so does generated text: past a third of the worker's memory either is
  // refused before its buffer is allocated (a failed allocation would
  // throw, and end the worker; generated text grew a worker to 3x its limit).
  // Workers of the plan that share their host's RAM each have a share of
  // it (Assignment.host_memory_budget_bytes), not all of it.
  const int64_t share = HostMemoryShare(assignment_);
  const bool shared = share > 0 && share < options_.memory_limit_bytes;
  const int64_t memory = shared ? share : options_.memory_limit_bytes;
  // 0 (no limit) stays none; any limit bounds it, a share of 1 or 2 bytes
  // too (a host whose RAM the others' limits claim), where 0 would mean
  // no bound.
  corpus.max_bytes = memory > 0 ? std::max<int64_t>(1, memory / 3) : 0;
  corpus.stop = &stop_;
  absl::StatusOr<std::vector<uint16_t>> loaded = LoadCorpus(corpus);
  if (loaded.status().code() == absl::StatusCode::kResourceExhausted) {
    const bool generated = data_path.empty();
    return absl::ResourceExhaustedError(absl::StrCat(
        generated ? "spec.data.synthetic_bytes: " : "spec.data.path: ", loaded.status().message(),
        shared ? absl::StrCat(" (a third of this worker's share of its host's memory, ", memory,
                              " bytes: the plan's workers on the host share its RAM)")
               : absl::StrCat(" (a third of this worker's memory limit of ", memory,
                              " bytes: --memory-limit, else its cgroup's limit or RAM)"),
        "; use ", generated ? "less generated text" : "a smaller file"));
  }
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, std::move(loaded));
  // Stop() joins this thread: each long step of the setup (the corpus's
  // read, the runtime, the weights to start from) ends its wait early.
  const auto stopped = [this](absl::string_view during) {
    return stop_.load() ? absl::CancelledError(absl::StrCat("stopped while ", during))
                        : absl::OkStatus();
  };
  RETURN_IF_ERROR(stopped("loading the training data"));
  // A recovery or a re-plan must train on the tokens the job began with: a
  // file replaced meanwhile (or another host's copy that differs) would
  // otherwise be used silently. The coordinator compares the first plan's
  // stages with each other by the digest sent with the start barrier.
  data_sha256_ = CorpusSha256(tokens);
  if (!assignment_.data_sha256().empty() && assignment_.data_sha256() != data_sha256_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.data",
        job.spec.data().path().empty() ? " (generated text)"
                                       : absl::StrCat(".path ", job.spec.data().path()),
        ": the tokens this worker read have SHA-256 ", data_sha256_,
        ", but the job began with tokens of SHA-256 ", assignment_.data_sha256(),
        " (Job.data_sha256): the file was changed or replaced since, or this host's copy "
        "differs; restore it, or submit a new job (spec.init.from its last checkpoint)"));
  }
  absl::StatusOr<Dataset> created = Dataset::Create(
      std::move(tokens), job.train.seq_len, job.val_fraction,
      {.seq_len = "spec.training.seq_len", .val_fraction = "spec.data.val_fraction"});
  if (!created.ok() && !job.spec.data().path().empty()) {  // say which file is short
    return absl::Status(
        created.status().code(),
        absl::StrCat("spec.data.path ", job.spec.data().path(), ": ", created.status().message()));
  }
  ASSIGN_OR_RETURN(Dataset dataset, std::move(created));
  const int replicas = std::max(1, assignment_.replicas());
  const int tensor = std::max(1, assignment_.tensor_parallel());
  const int workers = AssignmentWorkerCount(assignment_);  // checked: <= kMaxStages
  const bool replica_zero = assignment_.replica() == 0;
  // Tensor rank 0 speaks for its stage's ranks (they compute the same losses).
  const bool speaks = replica_zero && assignment_.tensor_rank() == 0;
  std::vector<std::string> peers(assignment_.peer_addresses().begin(),
                                 assignment_.peer_addresses().end());
  std::unique_ptr<Transport> transport = make_transport_(
      GlobalWorkerIndex(assignment_), peers,
      JobCredential{
          data_plane_job_,
          {assignment_.data_plane_send_keys().begin(), assignment_.data_plane_send_keys().end()}});
  {
    // Stop() aborts its sends: one to a stalled or vanished peer would
    // otherwise hold this worker (and the next plan's assignment) for the
    // transport's timeouts.
    AnnotatedMutexLock lock(&mu_);
    transport_ = transport.get();
    if (stop_.load()) transport_->Abort();  // a Stop() that came before
  }
  absl::Cleanup forget_transport = [&] {  // before the transport dies
    AnnotatedMutexLock lock(&mu_);
    transport_ = nullptr;
  };
  StageSetup setup{data_plane_job_,
                   job.train,
                   assignment_.stage(),
                   assignment_.num_stages(),
                   assignment_.forward_units(),
                   assignment_.backward_units(),
                   assignment_.program(),
                   options_.recv_timeout,
                   assignment_.eval_program(),
                   options_.backend};
  setup.optimizer_stages.assign(assignment_.optimizer_stages().begin(),
                                assignment_.optimizer_stages().end());
  setup.replica = assignment_.replica();
  setup.replicas = replicas;
  setup.stopped = [this] { return stop_.load(); };
  setup.tensor_rank = assignment_.tensor_rank();
  setup.tensor_parallel = tensor;
  setup.tensor_partitions = std::max(1, job.spec.parallelism().tensor_partitions());
  setup.tensor_compression = job.spec.parallelism().tensor_compression();  // checked by Create
  // Checked (0..16, only with per-unit partitions) by Create.
  setup.tensor_partition_tune_steps = job.spec.parallelism().tensor_partitions_tune_steps();
  // "1d" or "3d", checked by Create; a spec from before the field is 1-D.
  setup.tensor_mode =
      job.spec.parallelism().tensor_mode().empty() ? "1d" : job.spec.parallelism().tensor_mode();
  // Checked (length, values) by StageRuntime::Create.
  setup.tensor_partitions_forward.assign(assignment_.tensor_partitions_forward().begin(),
                                         assignment_.tensor_partitions_forward().end());
  setup.tensor_partitions_backward.assign(assignment_.tensor_partitions_backward().begin(),
                                          assignment_.tensor_partitions_backward().end());
  // plan.proto: 0 (exact) or a PowerSGD rank, with replicas to reduce over.
  const int dp_rank = assignment_.data_parallel_powersgd_rank();
  if (dp_rank < 0 || dp_rank > 1024 || (dp_rank > 0 && replicas < 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: data_parallel_powersgd_rank ", dp_rank, " with ", replicas,
                     " replicas; want 0, or 1..1024 with 2 replicas or more"));
  }
  setup.data_parallel_powersgd_rank = dp_rank;
  // Or a quantizer: bounded and parsed by StageRuntime::Create, which
  // refuses it beside a rank or without replicas.
  setup.data_parallel_quantizer = assignment_.data_parallel_quantizer();
  // Declared before the runtime, which uses them, so they are destroyed after.
  std::unique_ptr<DeviceChannel> device_channel;
  std::unique_ptr<DeviceCollective> replica_collective;
  // Stop() aborts what device_channel_ and replica_collective_ point to:
  // they must be cleared before the owners above die on any return, a
  // failed replica join after a device group join included.
  absl::Cleanup forget_channel = [&] {
    AnnotatedMutexLock lock(&mu_);
    device_channel_ = nullptr;
    replica_collective_ = nullptr;
  };
  // This worker's own shortcomings before the start barrier (which a
  // device or replica group passes first): a stage that fails before it is
  // ready is one the job can do without (a joiner is left out), one that
  // fails after it fails the job.
  if ((job.spec.checkpoint().interval_steps() > 0 || assignment_.has_resume()) &&
      options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        "job has checkpoints (spec.checkpoint) but this worker was started without "
        "--checkpoint-root; start it with the coordinator's --output-dir (a shared directory)");
  }
  if (!assignment_.init_weights().empty() && options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        "spec.init.from names weights, but this worker was started without --checkpoint-root "
        "(the coordinator's --output-dir, shared)");
  }
  // The units the stage starts from are read and decoded here, before the
  // start barrier, and restored once the runtime exists. A device or
  // replica group member passes the barrier before it builds its runtime:
  // had it read them after, its peers' first step would wait for that read
  // one receive timeout only, not the barrier's (AwaitAllStagesReady).
  const CheckpointIdentity identity{assignment_.job_id(), job.train.model, job.train.seed};
  const auto resume_failed = [&](const absl::Status& loaded) {
    // A device that failed (now or before: the runtime's setup does not
    // check) may have made any step of the load fail: the worker's
    // trouble, which must not cost the job a good checkpoint.
    const bool unusable = CheckpointItselfUnusable(loaded) && options_.backend->status().ok();
    if (!stop_.load()) ReportError(loaded, unusable);
    return loaded;
  };
  std::optional<ReadUnits> init_units;
  if (!assignment_.init_weights().empty()) {
    RETURN_IF_ERROR(stopped("setting up"));
    ASSIGN_OR_RETURN(init_units, ReadInitWeights(job.train.model));
  }
  std::optional<ReadUnits> resume_units;
  if (assignment_.has_resume()) {
    // The root first: a volume this worker cannot reach says nothing of the
    // checkpoint (UNAVAILABLE: the job recovers, and another plan may not
    // need this worker).
    if (const absl::Status root = CheckCheckpointRootReachable(); !root.ok()) {
      if (!stop_.load()) ReportError(root);
      return root;
    }
    const absl::Time load_start = MonotonicClock()->Now();
    absl::StatusOr<ReadUnits> read = ReadResume(identity);
    resume_load_seconds_ = absl::ToDoubleSeconds(MonotonicClock()->Now() - load_start);
    if (!read.ok()) return resume_failed(read.status());
    resume_units = *std::move(read);
  }
  const bool in_group = assignment_.device_group().stages_size() > 0;
  if (in_group) {
    // Joining waits for every member (up to the receive timeout, or a
    // stop): pass the start barrier first, so that a member that failed to
    // start fails the job there at once instead of after that wait.
    RETURN_IF_ERROR(AwaitAllStagesReady());
    ASSIGN_OR_RETURN(device_channel, JoinDeviceGroup());
    setup.device_channel = device_channel.get();
    AnnotatedMutexLock lock(&mu_);
    device_channel_ = device_channel.get();
    // A Stop() that came during the join missed the channel.
    if (stop_.load()) device_channel_->Abort();
  }
  const bool in_replica_group = assignment_.has_replica_device_group();
  if (in_replica_group) {
    // As for a device group: the start barrier first, then the join.
    if (!in_group) RETURN_IF_ERROR(AwaitAllStagesReady());
    ASSIGN_OR_RETURN(replica_collective, JoinReplicaGroup());
    setup.device_collective = replica_collective.get();
    AnnotatedMutexLock lock(&mu_);
    replica_collective_ = replica_collective.get();
    if (stop_.load()) replica_collective_->Abort();
  }
  // Device work that waits for peers: the host must not run far ahead of
  // it, and a job that ends early aborts it (below).
  const bool on_device_links = in_group || in_replica_group;
  RETURN_IF_ERROR(stopped("setting up"));
  ASSIGN_OR_RETURN(std::unique_ptr<StageRuntime> runtime,
                   StageRuntime::Create(setup, &dataset, transport.get()));
  {
    AnnotatedMutexLock lock(&mu_);
    runtime_ = runtime.get();
  }
  absl::Cleanup detach = [&] {  // the runtime dies with this scope
    AnnotatedMutexLock lock(&mu_);
    ending_.store(true);
    runtime_ = nullptr;
  };
  const v1::CheckpointSpec& checkpoints = job.spec.checkpoint();
  // The host copies read above are freed once restored, not held through
  // training.
  if (init_units.has_value()) {
    RETURN_IF_ERROR(runtime->Restore(init_units->states, 0));  // checks every shape
    PT_LOG(INFO) << "job " << assignment_.job_id() << " stage " << assignment_.stage()
                 << ": weights of " << init_units->states.size() << " units from "
                 << init_units->source;
    init_units.reset();
  }
  if (resume_units.has_value()) {
    const absl::Time restore_start = MonotonicClock()->Now();
    const absl::Status restored = RestoreResume(*runtime, *resume_units);
    resume_load_seconds_ += absl::ToDoubleSeconds(MonotonicClock()->Now() - restore_start);
    resume_units.reset();
    if (!restored.ok()) return resume_failed(restored);
  }
  // Declared after the runtime: destroyed first, waiting for a write in
  // progress (its snapshot is its own).
  std::unique_ptr<CheckpointWriter> writer;
  if (checkpoints.interval_steps() > 0) {
    writer = std::make_unique<CheckpointWriter>(
        options_.checkpoint_root, checkpoints.dir(), identity,
        [this](int64_t step, double seconds,
               const absl::StatusOr<std::vector<v1::UnitFile>>& files) {
          ReportCheckpoint(step, seconds, files);
        },
        options_.checkpoint_hold, [this] { return stop_.load(); });
  }
  // In a device group a receive returns before its data arrive, so nothing
  // else keeps the host from queuing iterations far ahead of its GPU (each
  // sent activation held until its peer takes it; at last a CUDA call
  // blocked on a full launch queue). After queuing iteration `it` the host
  // waits for the device to finish iteration it - 1: a copy of `marker`
  // queued behind each iteration says when. A STOP ends the wait (its
  // abort ends the link kernels the device may be waiting on). Declared
  // before the abort below, so that on a failure the channel is aborted
  // before the pending marker's teardown waits for the device.
  const Tensor marker = on_device_links ? options_.backend->Zeros({1}) : Tensor();
  std::unique_ptr<PendingDownload> previous_iteration_done;
  // Set where the stage ends without an error: it ran every step, or it
  // stopped at a step boundary (its device transfers flushed), where slower
  // peers may still need its queued sends of that step.
  bool ended_cleanly = false;
  // Unless the stage ended cleanly, peers may never match what the device
  // has queued: abort before the runtime's teardown waits on the device.
  // And a failed plan's queued sends are of no use to anyone: abort them
  // too, or the runtime's and the transport's teardown wait for a stalled
  // peer to take them (up to the transport's drain timeout per peer),
  // holding this worker, which a STOP could no longer cut short, from the
  // next plan.
  absl::Cleanup abort_unless_completed = [&] {
    const bool abort_device = !completed_.load() && !ended_cleanly;
    if (abort_device && device_channel != nullptr) device_channel->Abort();
    if (abort_device && replica_collective != nullptr) replica_collective->Abort();
    // Whatever stop_ says: Stop() sets it before it takes mu_ to abort the
    // transport, and this thread may forget the transport in between, so
    // that nobody would abort it (Abort is idempotent).
    if (!completed_.load() && !ended_cleanly) transport->Abort();
  };
  // The checkpoint's load time goes with the start barrier, or without
  // one with the first iteration's report. A device or replica group
  // member, which passed the barrier having only read it, sends its
  // restore too with that report (the coordinator keeps the longest).
  bool load_reported = false;
  if (workers > 1 && !on_device_links) {
    RETURN_IF_ERROR(AwaitAllStagesReady());
    load_reported = true;
  }
  const int64_t steps = job.train.steps;
  // Replica 0 speaks for all replicas (their weights are the same): it
  // uploads, checkpoints and reports the losses; its tensor rank 0 for the
  // stage's ranks, after they gathered their shards.
  const bool upload = !job.spec.output().weights_path().empty() && replica_zero;
  // Every device transfer and sum of the step done before the stage says
  // it finished (or stops at a boundary): a peer that never takes a send or
  // joins a sum fails the job here, with an error, instead of a teardown
  // aborting it unseen; and a transfer a slower peer still takes is not cut
  // off by this stage's abort.
  const auto flush_device_links = [&](absl::string_view which_step) {
    const auto stopped = [this] { return stop_.load(); };
    const auto said = [&](const absl::Status& s, absl::string_view group, absl::string_view what) {
      return s.ok() ? s
                    : absl::Status(s.code(), absl::StrCat(group, ": ", which_step, " ", what,
                                                          " did not complete: ", s.message()));
    };
    absl::Status flushed = absl::OkStatus();
    if (device_channel != nullptr) {
      flushed =
          said(device_channel->Flush(options_.recv_timeout, stopped), "device group", "transfers");
    }
    if (flushed.ok() && replica_collective != nullptr) {
      flushed = said(replica_collective->Flush(options_.recv_timeout, stopped),
                     "replica device group", "sums");
    }
    return flushed;
  };
  // A checkpoint refused for a diverged state (ReportCheckpoint) fails
  // the job: asked before each step, and after each wait for the writer.
  const auto diverged = [&] {
    const absl::Status d = CheckpointDiverged();
    if (!d.ok() && !stop_.load()) ReportError(d);
    return d;
  };
  for (int64_t it = assignment_.start_iteration(); it < steps && !stop_.load(); ++it) {
    RETURN_IF_ERROR(diverged());
    v1::StepTrace trace;
    const bool traced = IsTracedStep(it, assignment_.start_iteration(), steps);
    absl::StatusOr<IterationResult> result = runtime->RunIteration(it, traced ? &trace : nullptr);
    if (result.ok() && on_device_links) {
      std::unique_ptr<PendingDownload> done = options_.backend->StartDownload(marker);
      if (previous_iteration_done != nullptr) {
        absl::StatusOr<Tensor> waited = previous_iteration_done->Wait();
        if (!waited.ok()) result = waited.status();
      }
      previous_iteration_done = std::move(done);
    }
    if (!result.ok()) {
      // Report now: tearing down the transport may wait for a stalled
      // peer to take queued frames (GrpcTransport's drain timeout).
      if (!stop_.load()) ReportError(result.status());
      return result.status();
    }
    // Stopped during the iteration: after an abort its results may be
    // garbage; report and upload nothing.
    if (stop_.load()) break;
    if (observer_) observer_(*result);
    const bool last = it + 1 == steps;
    if (last && on_device_links) {
      const absl::Status flushed = flush_device_links("the last step's");
      if (!flushed.ok()) {
        if (stop_.load()) break;
        ReportError(flushed);
        return flushed;
      }
    }
    // Validation after the same steps as train-local's --eval-interval.
    std::optional<float> val_loss;
    double eval_seconds = 0;
    const int interval = job.train.eval_interval;
    if (interval > 0 && ((it + 1) % interval == 0 || last)) {
      const absl::Time eval_start = MonotonicClock()->Now();
      absl::StatusOr<std::optional<float>> evaluated = runtime->RunEval(it + 1);
      eval_seconds = absl::ToDoubleSeconds(MonotonicClock()->Now() - eval_start);
      if (!evaluated.ok()) {
        if (!stop_.load()) ReportError(evaluated.status());
        return evaluated.status();
      }
      if (stop_.load()) break;
      val_loss = *evaluated;
    }
    // The last step's loss is finite, but an infinite gradient element may
    // have made its weights NaN: fail rather than upload or finish with
    // them (every earlier step's weights were checked by the next loss).
    std::vector<Parameter> final_weights;
    if (last) {
      final_weights = HostParameterCopies(options_.backend, runtime->parameters());
      absl::Status finite = options_.backend->status();
      if (finite.ok()) finite = CheckWeightsAfterStep(steps, CheckParametersFinite(final_weights));
      if (!finite.ok()) {
        if (!stop_.load()) ReportError(finite);
        return finite;
      }
    }
    // A refusal of the checkpoint of step steps - 1 (ReportCheckpoint)
    // may land while the last step runs, its weights still finite: known
    // before the upload, not behind it (a diverged model of GBs sent for
    // minutes, or the divergence never reported when the upload failed).
    if (last && upload && writer != nullptr) {
      writer->Wait();
      RETURN_IF_ERROR(diverged());
    }
    if (last && upload) {
      // Every tensor rank takes part in the gather; rank 0 uploads.
      absl::StatusOr<std::vector<Parameter>> host = runtime->UnsplitParameterCopies(steps);
      absl::Status uploaded = host.status();
      if (uploaded.ok() && speaks) {
        uploaded = UploadWeightsWithRetries(ParameterPointers(*host));
        // Said so: the code alone (UNAVAILABLE, DEADLINE_EXCEEDED) named
        // nothing. Still a peer failure (ReportError): a job with
        // checkpoints recovers and uploads again.
        if (!uploaded.ok()) {
          uploaded = absl::Status(
              uploaded.code(),
              absl::StrCat("uploading the final weights to the coordinator: ", uploaded.message()));
        }
      }
      if (!uploaded.ok()) return uploaded;
    }
    v1::ReportProgressRequest r;
    r.set_worker_id(options_.worker_id);
    r.set_incarnation(options_.incarnation);
    r.set_job_id(assignment_.job_id());
    r.set_plan_version(assignment_.plan_version());
    r.set_iteration(it);
    if (!load_reported) {  // and the data's digest
      r.set_resume_load_seconds(resume_load_seconds_);
      r.set_data_sha256(data_sha256_);
      load_reported = true;
    }
    if (speaks) {
      for (float loss : result->micro_batch_losses) r.add_micro_batch_losses(loss);
    }
    r.set_busy_seconds(result->busy_seconds);
    r.set_idle_seconds(result->idle_seconds);
    if (traced) *r.mutable_trace() = std::move(trace);
    r.set_finished(last);
    if (last && replicas > 1) r.set_weights_digest(WeightsDigest(final_weights));
    if (val_loss.has_value() && speaks) r.set_val_loss(*val_loss);
    r.set_eval_seconds(eval_seconds);
    // The job ends with the last report: a checkpoint still being written
    // must be reported before it (ReportCheckpoint runs on the writer).
    if (last && writer != nullptr) {
      writer->Wait();
      RETURN_IF_ERROR(diverged());
    }
    absl::StatusOr<v1::ReportProgressResponse> reported = ReportWithRetries(r);
    if (!reported.ok()) {
      return absl::Status(reported.status().code(),
                          absl::StrCat("reporting iteration ", it,
                                       " to the coordinator: ", reported.status().message()));
    }
    if (last) {
      completed_.store(true);
      if (options_.on_completed) options_.on_completed();
      break;
    }
    // A checkpoint of the weights after this step, written in the
    // background, and reported after the step's progress (the coordinator
    // resumes only where the loss history reaches); none after the last
    // step. Also at a step boundary the coordinator asked for, after which
    // the stage stops for the next plan.
    const int64_t step = it + 1;
    const int64_t stop_after = reported->stop_after_step();
    if (stop_after > 0 && stop_after < step) {
      absl::Status passed = absl::AbortedError(
          absl::StrCat("the job re-plans after step ", stop_after,
                       ", but this stage had completed step ", step, " when it learned so"));
      ReportError(passed);
      return passed;
    }
    const bool boundary = stop_after == step;
    if (boundary) boundary_step_.store(step);  // before its checkpoint is submitted
    // Every tensor rank takes part in gathering the shards, and with
    // compressed data-parallel gradients every replica in gathering its
    // error feedback; replica 0's tensor rank 0 writes.
    const bool snapshots =
        assignment_.backward_units().end() > assignment_.backward_units().begin() &&
        (replica_zero || runtime->SnapshotsEveryReplica());
    if (writer != nullptr && snapshots && (step % checkpoints.interval_steps() == 0 || boundary)) {
      // The previous write first (Submit waits for it anyway): its
      // snapshot, three host copies of the stage's stepped weights, is
      // freed before this one is taken, not held beside it.
      if (replica_zero && assignment_.tensor_rank() == 0) writer->Wait();
      RETURN_IF_ERROR(diverged());
      absl::StatusOr<StageSnapshot> snapshot = runtime->Snapshot(step);
      if (!snapshot.ok()) {
        if (!stop_.load()) ReportError(snapshot.status());
        return snapshot.status();
      }
      if (replica_zero && assignment_.tensor_rank() == 0) writer->Submit(*std::move(snapshot));
    }
    if (boundary) {
      if (on_device_links) {
        const absl::Status flushed = flush_device_links("the boundary step's");
        if (!flushed.ok()) {
          if (stop_.load()) break;
          ReportError(flushed);
          return flushed;
        }
      }
      if (writer != nullptr) writer->Wait();
      RETURN_IF_ERROR(diverged());
      PT_LOG(INFO) << "job " << assignment_.job_id() << " stage " << assignment_.stage()
                   << ": stopped after step " << step << " for the next plan";
      ended_cleanly = true;
      return absl::OkStatus();
    }
  }
  // Every step ran, or a Stop() ended it. A Stop() that came after this
  // runner let go of its transport and device channel aborted neither:
  // not clean then, so the cleanup aborts them rather than let their
  // destructors drain sends to peers that are stopping too.
  ended_cleanly = !stop_.load();
  return absl::OkStatus();
}

}  // namespace pipetrain
