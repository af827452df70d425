#include "coordinator/registry/worker_registry.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/build_identity.h"
#include "common/echo_input.h"
#include "common/enum_names.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "coordinator/registry/registration_limits.h"

namespace pipetrain {
namespace {

constexpr absl::string_view kIdPrefix = "w-";

constexpr char kSessionSeparator = '.';

constexpr char kBadSession[] =
    "session credential not recognised: it is malformed, or its worker incarnation is not "
    "current (the coordinator restarted, or the worker registered again); register again";

// A session credential's parts, "<worker id>.<incarnation>.<secret>";
// nullopt when malformed (or longer than any the registry hands out).
struct SessionParts {
  std::string worker_id;
  int64_t incarnation = 0;
  absl::string_view secret;
};
std::optional<SessionParts> ParseSessionToken(absl::string_view token) {
  const std::vector<absl::string_view> parts = absl::StrSplit(token, kSessionSeparator);
  SessionParts out;
  if (token.size() > kMaxSecretBytes || parts.size() != 3 ||
      !absl::SimpleAtoi(parts[1], &out.incarnation)) {
    return std::nullopt;
  }
  out.worker_id = std::string(parts[0]);
  out.secret = parts[2];
  return out;
}

// What a heartbeat reports for a worker that runs no job: "idle", or
// nothing (a worker that never reported one). A stage between steps says
// "between steps", and one being stopped "stopping job J".
bool IsIdleInstruction(const std::string& instruction) {
  return instruction.empty() || instruction == "idle";
}

bool IsLive(v1::WorkerState state) {
  return state == v1::WORKER_STATE_JOINING || state == v1::WORKER_STATE_READY ||
         state == v1::WORKER_STATE_ASSIGNED;
}

// The diagram in worker_registry.h, as a predicate.
bool IsLegalTransition(v1::WorkerState from, v1::WorkerState to) {
  switch (to) {
    case v1::WORKER_STATE_JOINING:
      return true;  // a new incarnation may start from any state
    case v1::WORKER_STATE_READY:
      return from == v1::WORKER_STATE_JOINING || from == v1::WORKER_STATE_ASSIGNED;
    case v1::WORKER_STATE_ASSIGNED:
      return from == v1::WORKER_STATE_READY;
    case v1::WORKER_STATE_LOST:
      return IsLive(from);
    case v1::WORKER_STATE_LEFT:
      return from != v1::WORKER_STATE_UNSPECIFIED && from != v1::WORKER_STATE_LEFT;
    default:
      return false;
  }
}

// "worker w-3 (10.0.0.5:7001 on node-a)": the id plus where to look.
std::string Describe(const v1::Worker& worker) {
  std::string where = worker.data_address();
  if (!worker.node_name().empty()) absl::StrAppend(&where, " on ", worker.node_name());
  return absl::StrCat("worker ", worker.id(), " (", where, ")");
}

// A worker running no job went LOST. An assigned one's loss is told by its
// job (the listener; the job's reason names it), but nothing names an idle
// one: pipetrain_workers{state="LOST"} carries no id, and `lost_why` reaches
// only the worker's own next heartbeat. Rate-limited, shared by MarkLost and
// CheckLeases: a partition that loses a fleet at once logs 10 lines per
// 10 s and counts the rest.
void LogIdleWorkerLost(const v1::Worker& worker, absl::string_view why) {
  static LogRateLimiter lost_log(10, absl::Seconds(10));
  if (int64_t dropped = 0; lost_log.Allow(&dropped)) {
    PT_LOG(WARNING) << Describe(worker) << ", running no job, is LOST: " << why
                    << LogRateLimiter::Dropped(dropped);
  }
}

}  // namespace

absl::Status WorkerRegistry::ValidateOptions(const Options& options) {
  const absl::Duration interval = options.heartbeat_interval;
  if (interval <= absl::ZeroDuration() || interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval must be positive and finite, got ", absl::FormatDuration(interval)));
  }
  if (options.lease <= interval || options.lease == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease (", absl::FormatDuration(options.lease),
        ") must be finite and longer than heartbeat_interval (", absl::FormatDuration(interval),
        "); otherwise workers that heartbeat on time are declared lost"));
  }
  if (options.max_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_workers must be >= 1, got ", options.max_workers));
  }
  return absl::OkStatus();
}

WorkerRegistry::WorkerRegistry(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock()),
      lease_clock_(options_.lease_clock != nullptr ? options_.lease_clock : clock_) {
  const absl::Status valid = ValidateOptions(options_);
  PT_CHECK(valid.ok()) << valid;
}

WorkerRegistry::~WorkerRegistry() { Stop(); }

// ---------------------------------------------------------------- Register

absl::Status WorkerRegistry::CheckJoinToken(absl::string_view join_token) const {
  if (options_.join_token.empty() || ConstantTimeEquals(join_token, options_.join_token)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "join token rejected; give the worker the coordinator's join token (its --join-token or "
      "--join-token-file)");
}

absl::Status WorkerRegistry::CheckRegistration(const v1::RegisterWorkerRequest& request) const {
  RETURN_IF_ERROR(CheckJoinToken(request.join_token()));
  if (request.data_address().empty()) {
    return absl::InvalidArgumentError(
        "RegisterWorkerRequest.data_address is empty; the worker must report the host:port its "
        "data plane listens on");
  }
  RETURN_IF_ERROR(CheckRegistrationBounds(request));
  if (options_.required_build.has_value() &&
      !SameBuild(request.build(), *options_.required_build)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the worker at ", EchoInput(request.data_address()), " runs build ",
        EchoInput(DescribeBuild(request.build()), 160), ", not the coordinator's ",
        DescribeBuild(*options_.required_build),
        "; one cluster runs one build (replicas must round alike), so start the worker from the "
        "coordinator's build, or start the coordinator with --allow-mixed-builds"));
  }
  // Registered (SameBuild compares the version alone), but unchecked: an
  // image built without PIPETRAIN_COMMIT may be of any commit of the
  // version. Said where an operator looks, as an unstamped coordinator says
  // so of itself at start.
  if (options_.required_build.has_value() && CommitKnown(options_.required_build->commit()) &&
      !CommitKnown(request.build().commit())) {
    static LogRateLimiter unstamped_log(10, absl::Seconds(60));
    if (int64_t dropped = 0; unstamped_log.Allow(&dropped)) {
      PT_LOG(WARNING) << "the worker at " << EchoInput(request.data_address())
                      << " runs an unstamped build ("
                      << EchoInput(DescribeBuild(request.build()), 160)
                      << "): only its version is checked against this coordinator's "
                      << DescribeBuild(*options_.required_build)
                      << "; build its image with --build-arg PIPETRAIN_COMMIT"
                      << LogRateLimiter::Dropped(dropped);
    }
  }
  if (request.data_plane_tls() != options_.data_plane_tls) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the worker at ", EchoInput(request.data_address()),
        request.data_plane_tls()
            ? " serves its data plane with TLS (--data-tls-cert), but the coordinator has no "
              "--worker-tls-ca to reach workers so; give the coordinator --worker-tls-ca, "
              "--worker-tls-cert and --worker-tls-key, or start the worker without --data-tls-*"
            : " serves its data plane in plaintext, but the coordinator's workers use TLS "
              "(--worker-tls-ca); start the worker with --data-tls-cert, --data-tls-key and "
              "--data-tls-ca, as the others"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerRegistry::Register(
    const v1::RegisterWorkerRequest& request) {
  RETURN_IF_ERROR(CheckRegistration(request));
  std::vector<Loss> losses;
  LossListener listener;
  v1::RegisterWorkerResponse response;
  std::future<absl::Status> saving;
  {
    AnnotatedMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Entry * found, EntryForAddressLocked(request.data_address()));
    Entry& entry = *found;
    const v1::Worker& old = entry.worker;
    // A retry of the registration that made the current incarnation (its
    // answer was lost to a deadline while its save committed): the same
    // answer. A new incarnation left that one, which nobody held, READY
    // (a job placed on it lost the worker), or superseded the one a job
    // was placed on meanwhile. Saved already (READY or ASSIGNED). The id
    // is a secret (with the join token it yields the session token):
    // compared in constant time.
    if (!request.registration_id().empty() &&
        ConstantTimeEquals(request.registration_id(), entry.registration_id) &&
        (old.state() == v1::WORKER_STATE_READY || old.state() == v1::WORKER_STATE_ASSIGNED) &&
        (!request.drained() || old.drained())) {
      TouchLocked(entry, clock_->Now());
      response.set_worker_id(old.id());
      response.set_incarnation(old.incarnation());
      response.set_session_token(SessionTokenOf(entry));
      response.set_heartbeat_interval_seconds(absl::ToDoubleSeconds(options_.heartbeat_interval));
      response.set_lease_seconds(absl::ToDoubleSeconds(options_.lease));
      // Rate-limited: a join-token holder can repeat one registration at will.
      static LogRateLimiter repeats_log(10, absl::Seconds(10));
      if (int64_t dropped = 0; repeats_log.Allow(&dropped)) {
        PT_LOG(INFO) << Describe(old) << " registered again with the same registration (the "
                     << "answer to the first was lost): answered with its incarnation "
                     << old.incarnation() << LogRateLimiter::Dropped(dropped);
      }
      return response;
    }
    if (old.state() == v1::WORKER_STATE_ASSIGNED) {
      // Naming the incarnation before the current one, the process did not
      // restart: the answer to its last registration was lost (a timeout),
      // and the job was placed on that incarnation while it tried again.
      const bool answer_lost = request.previous_incarnation() > 0 &&
                               request.previous_incarnation() == old.incarnation() - 1;
      losses.push_back(
          {old.id(), old.job_id(),
           absl::StrCat(Describe(old), " registered again, superseding incarnation ",
                        old.incarnation(), " that was running job ", old.job_id(),
                        answer_lost ? "; the answer to the registration that made it was lost "
                                      "(a timeout), so the worker registered once more"
                                    : "; the worker process restarted; check its log for why"),
           old.incarnation()});
    }
    StartIncarnationLocked(entry, request);  // JOINING: placed nowhere yet
    listener = listener_;
    v1::Worker ready = entry.worker;
    ready.set_state(v1::WORKER_STATE_READY);
    saving = SaveLocked(ready);
    response.set_worker_id(entry.worker.id());
    response.set_incarnation(entry.worker.incarnation());
    response.set_session_token(SessionTokenOf(entry));
  }
  // Even when the registration could not be saved: the old incarnation is
  // superseded in memory all the same (its process restarted), and no later
  // registration would report the loss (the entry is no longer ASSIGNED).
  Notify(listener, losses);
  // Off the lock: heartbeats go on while the store takes its time.
  const absl::Status saved = saving.get();
  {
    AnnotatedMutexLock lock(&mu_);
    Entry* entry = FindLocked(response.worker_id());
    // Unchanged since (not registered again, not lost to its lease while
    // the save took long): READY once saved. Unsaved, the caller is told to
    // retry and gets no session: the new incarnation must not be placed
    // (nobody holds it).
    if (entry != nullptr && entry->worker.incarnation() == response.incarnation() &&
        entry->worker.state() == v1::WORKER_STATE_JOINING) {
      SetStateLocked(*entry, saved.ok() ? v1::WORKER_STATE_READY : v1::WORKER_STATE_LOST);
      TouchLocked(*entry, clock_->Now());  // its lease starts as it is told of it
    }
  }
  if (!saved.ok()) {
    return absl::UnavailableError(
        absl::StrCat("could not record the registration durably; retry: ", saved.message()));
  }
  response.set_heartbeat_interval_seconds(absl::ToDoubleSeconds(options_.heartbeat_interval));
  response.set_lease_seconds(absl::ToDoubleSeconds(options_.lease));
  return response;
}

absl::StatusOr<WorkerRegistry::Entry*> WorkerRegistry::EntryForAddressLocked(
    const std::string& data_address) {
  auto known = number_by_address_.find(data_address);
  if (known != number_by_address_.end()) return &workers_.at(known->second);
  if (static_cast<int>(workers_.size()) >= options_.max_workers && !EvictOneLocked()) {
    int awaited = 0;
    for (const auto& [number, entry] : workers_) {
      if (AwaitedSinceRestoreLocked(entry)) ++awaited;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator already tracks ", workers_.size(),
        " workers (its limit), none of them LEFT or LOST that it may drop",
        awaited == 0
            ? ""
            : absl::StrCat(" (", awaited, " restored at its restart are kept for a lease, ",
                           absl::FormatDuration(options_.lease), ", to register again)"),
        "; retry later, or deregister idle workers"));
  }
  const int64_t number = ++last_number_;
  number_by_address_[data_address] = number;
  Entry& entry = workers_[number];
  entry.worker.set_id(absl::StrCat(kIdPrefix, number));
  return &entry;
}

bool WorkerRegistry::EvictOneLocked() {
  auto oldest = workers_.end();
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    // A restored worker not heard from yet may be alive, its registration
    // queued behind others: evicted, it came back under a new id, its drain
    // and stored record gone. (All were seen at the restore, and the tie
    // took the lowest id, which long-lived workers hold.)
    if (IsLive(it->second.worker.state()) || AwaitedSinceRestoreLocked(it->second)) continue;
    if (oldest == workers_.end() || it->second.last_seen < oldest->second.last_seen) oldest = it;
  }
  if (oldest == workers_.end()) return false;
  --counts_[oldest->second.worker.state()];
  number_by_address_.erase(oldest->second.worker.data_address());
  ForgetLocked(oldest->second.worker.id());
  workers_.erase(oldest);
  return true;
}

std::string WorkerRegistry::SessionTokenOf(const Entry& entry) {
  return absl::StrCat(entry.worker.id(), std::string(1, kSessionSeparator),
                      entry.worker.incarnation(), std::string(1, kSessionSeparator),
                      entry.session_secret);
}

absl::StatusOr<WorkerRegistry::SessionIdentity> WorkerRegistry::AuthenticateSession(
    absl::string_view token) const {
  const std::optional<SessionParts> parts = ParseSessionToken(token);
  if (!parts.has_value()) return absl::UnauthenticatedError(kBadSession);
  const int64_t incarnation = parts->incarnation;
  AnnotatedMutexLock lock(&mu_);
  const Entry* entry = FindLocked(parts->worker_id);
  // The secret is compared even for a stale incarnation, so the time taken
  // does not tell a guesser which part was wrong.
  // An entry without a secret has no session (defence in depth: every
  // path that makes an entry sets one).
  const bool secret_ok = entry != nullptr && !entry->session_secret.empty() &&
                         ConstantTimeEquals(parts->secret, entry->session_secret);
  if (!secret_ok || incarnation != entry->worker.incarnation()) {
    return absl::UnauthenticatedError(kBadSession);
  }
  return SessionIdentity{entry->worker.id(), incarnation};
}

bool WorkerRegistry::IsStaleSession(absl::string_view token) const {
  const std::optional<SessionParts> parts = ParseSessionToken(token);
  if (!parts.has_value() || parts->incarnation < 1) return false;
  AnnotatedMutexLock lock(&mu_);
  const Entry* entry = FindLocked(parts->worker_id);
  if (entry == nullptr) return false;
  // The incarnation before the current one, with its own secret: proven.
  // Compared as current - 1: a token's incarnation is any int64 a stranger
  // sends, and INT64_MAX + 1 overflowed (undefined; a sanitizer build
  // aborted on it).
  if (entry->worker.incarnation() > 1 && parts->incarnation == entry->worker.incarnation() - 1) {
    return !entry->previous_secret.empty() &&
           ConstantTimeEquals(parts->secret, entry->previous_secret);
  }
  // The current one of a worker restored from the store: its secret died
  // with the old coordinator, so the token cannot be checked; taken for
  // one lease after the restore only (the burst of a restart), so that a
  // stranger naming a dead worker's id is not hidden for good.
  return parts->incarnation == entry->worker.incarnation() && AwaitedSinceRestoreLocked(*entry);
}

bool WorkerRegistry::AwaitedSinceRestoreLocked(const Entry& entry) const {
  // A duration, so the lease clock's: on the wall clock a step back after a
  // restart kept restored workers for the step too (new ones refused while
  // full), and one forward let a live restored worker be evicted at once.
  return entry.restored_unheard && lease_clock_->Now() - entry.restored_at <= options_.lease;
}

absl::StatusOr<std::string> WorkerRegistry::SessionToken(const std::string& worker_id) const {
  AnnotatedMutexLock lock(&mu_);
  const Entry* entry = FindLocked(worker_id);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", EchoInput(worker_id), " is not registered"));
  }
  return SessionTokenOf(*entry);
}

bool WorkerRegistry::IsFreshNcclId(const Entry& entry, const std::string& id) {
  return !id.empty() && id != entry.consumed_nccl_id;
}

void WorkerRegistry::StartIncarnationLocked(Entry& entry,
                                            const v1::RegisterWorkerRequest& request) {
  v1::Worker& worker = entry.worker;
  // The process of a drained incarnation registering again (a drain it
  // may not have heard of when the coordinator restarted): drained still.
  // An earlier incarnation than the current one is that process too: a
  // registration retried after its answer was lost, or after its save
  // failed, names the incarnation before the one it was given unknowingly.
  // A new process names 0; one naming a later incarnation than any here
  // belongs to other state.
  const bool drain_kept = worker.drained() && worker.incarnation() > 0 &&
                          request.previous_incarnation() > 0 &&
                          request.previous_incarnation() <= worker.incarnation();
  worker.set_incarnation(worker.incarnation() + 1);
  entry.previous_secret = std::move(entry.session_secret);
  entry.session_secret = RandomToken();
  entry.registration_id = request.registration_id();
  *worker.mutable_device() = request.device();
  // Fields this version does not know are kept by protobuf and bounded by
  // nothing but the request limit (4 MiB a worker, in every listing and
  // /metrics scrape): only the known ones, which CheckDevice bounded, stay.
  worker.mutable_device()->DiscardUnknownFields();
  // Kept in the entry only (see worker_registry.h).
  const std::string& nccl_id = request.device().nccl_unique_id();
  entry.nccl_unique_id = IsFreshNcclId(entry, nccl_id) ? nccl_id : "";
  worker.mutable_device()->clear_nccl_unique_id();
  worker.set_data_address(request.data_address());
  worker.set_metrics_address(request.metrics_address());
  worker.set_node_name(request.node_name());
  if (request.has_build()) {
    *worker.mutable_build() = request.build();
    worker.mutable_build()->DiscardUnknownFields();
  } else {
    worker.clear_build();  // a worker older than BuildIdentity
  }
  // A drained process registering again stays drained (JobManager reads
  // this): set with READY, so no placement comes between.
  worker.set_drained(request.drained() || drain_kept);
  worker.clear_job_id();
  worker.clear_current_instruction();
  entry.stopping = false;  // a new process runs nothing yet
  entry.released_job.clear();
  entry.restored_unheard = false;
  entry.lost_why.clear();
  TouchLocked(entry, clock_->Now());
  SetStateLocked(entry, v1::WORKER_STATE_JOINING);  // READY once saved (Register)
}

// ------------------------------------------------------ Heartbeat, Deregister

absl::Status WorkerRegistry::Heartbeat(const v1::HeartbeatRequest& request) {
  if (request.worker_id().empty() || request.incarnation() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HeartbeatRequest: worker_id '", request.worker_id(), "', incarnation ",
                     request.incarnation(), "; send the id and incarnation Register returned"));
  }
  RETURN_IF_ERROR(CheckHeartbeatBounds(request));
  AnnotatedMutexLock lock(&mu_);
  Entry* entry = FindLocked(request.worker_id());
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(),
                                            " is not registered (did the coordinator restart?); "
                                            "re-register"));
  }
  RETURN_IF_ERROR(CheckIncarnationLocked(*entry, request.incarnation()));
  const v1::WorkerState state = entry->worker.state();
  if (!IsLive(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(entry->worker), " is ", EnumShortName(state),
                     state == v1::WORKER_STATE_LOST && !entry->lost_why.empty()
                         ? absl::StrCat(" (", entry->lost_why, ")")
                         : "",
                     "; re-register to start a new incarnation"));
  }
  TouchLocked(*entry, clock_->Now());
  // The incarnation's session reached its worker (over gRPC this heartbeat
  // carried it): the answer to its registration is no longer lost, so the
  // id that would repeat it, and hand out the session token again, retires.
  entry->registration_id.clear();
  entry->worker.set_current_instruction(request.current_instruction());
  // Idle after the job it was released from, not before it took that job
  // (a heartbeat sent then, arriving after the job ended).
  const bool idle_after_release = !request.has_last_job_id() || entry->released_job.empty() ||
                                  request.last_job_id() == entry->released_job;
  if (IsIdleInstruction(request.current_instruction()) && idle_after_release) {
    entry->stopping = false;
    entry->last_idle = clock_->Now();
  } else if (entry->worker.state() == v1::WORKER_STATE_READY &&
             absl::StartsWith(request.current_instruction(), "stopping job ")) {
    // A READY worker still stopping a job (its RUN taken within a
    // heartbeat of the release, so Release saw "idle"; or a stop that
    // hangs): not ready until its idle heartbeat naming that job. Counted
    // ready, it was planned again and never took its RUN.
    entry->stopping = true;
    if (request.has_last_job_id()) entry->released_job = request.last_job_id();
  }
  if (IsFreshNcclId(*entry, request.nccl_unique_id())) {
    entry->nccl_unique_id = request.nccl_unique_id();
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Deregister(const std::string& worker_id, int64_t incarnation) {
  std::vector<Loss> losses;
  LossListener listener;
  {
    AnnotatedMutexLock lock(&mu_);
    Entry* entry = FindLocked(worker_id);
    if (entry == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("worker ", EchoInput(worker_id), " is not registered"));
    }
    RETURN_IF_ERROR(CheckIncarnationLocked(*entry, incarnation));
    const v1::Worker& worker = entry->worker;
    if (worker.state() == v1::WORKER_STATE_LEFT) return absl::OkStatus();
    if (worker.state() == v1::WORKER_STATE_ASSIGNED) {
      losses.push_back(
          {worker.id(), worker.job_id(),
           absl::StrCat(Describe(worker), " deregistered while running job ", worker.job_id(),
                        "; it was shut down; check who stopped it and its log"),
           worker.incarnation()});
    }
    SetStateLocked(*entry, v1::WORKER_STATE_LEFT);
    // Saved so that a restarted coordinator lists it LEFT, not LOST (which
    // the PipetrainWorkerLost alert counts). Not an error if it cannot be:
    // the worker leaves all the same, and would only be listed LOST (the
    // store thread logs it).
    SaveLocked(entry->worker);
    listener = listener_;
  }
  Notify(listener, losses);
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckIncarnationLocked(const Entry& entry, int64_t incarnation) const {
  const int64_t current = entry.worker.incarnation();
  if (incarnation < current) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", entry.worker.id(),
                                                      ": incarnation ", incarnation,
                                                      " superseded by ", current, "; re-register"));
  }
  if (incarnation > current) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", entry.worker.id(), ": incarnation ", incarnation,
                     " was never issued (current is ", current, "); re-register"));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ Queries

std::optional<int64_t> WorkerIdNumber(absl::string_view id) {
  int64_t number = 0;
  if (!absl::ConsumePrefix(&id, kIdPrefix) || !absl::SimpleAtoi(id, &number)) return std::nullopt;
  return number;
}

WorkerRegistry::Entry* WorkerRegistry::FindLocked(const std::string& worker_id) {
  const std::optional<int64_t> number = WorkerIdNumber(worker_id);
  if (!number.has_value()) return nullptr;
  auto it = workers_.find(*number);
  // The id check rejects spellings SimpleAtoi accepts, such as "w-01".
  if (it == workers_.end() || it->second.worker.id() != worker_id) return nullptr;
  return &it->second;
}

const WorkerRegistry::Entry* WorkerRegistry::FindLocked(const std::string& worker_id) const {
  return const_cast<WorkerRegistry*>(this)->FindLocked(worker_id);
}

std::vector<v1::Worker> WorkerRegistry::List() const {
  AnnotatedMutexLock lock(&mu_);
  records_read_ += workers_.size();
  std::vector<v1::Worker> workers;
  workers.reserve(workers_.size());
  for (const auto& [number, entry] : workers_) workers.push_back(entry.worker);
  return workers;
}

absl::StatusOr<v1::Worker> WorkerRegistry::Get(const std::string& worker_id) const {
  AnnotatedMutexLock lock(&mu_);
  ++records_read_;
  const Entry* entry = FindLocked(worker_id);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", EchoInput(worker_id), " is not registered"));
  }
  return entry->worker;
}

std::vector<std::string> WorkerRegistry::ReadyWorkers() const {
  AnnotatedMutexLock lock(&mu_);
  records_read_ += workers_.size();
  std::vector<std::string> ids;
  for (const auto& [number, entry] : workers_) {
    if (entry.worker.state() == v1::WORKER_STATE_READY && !entry.stopping) {
      ids.push_back(entry.worker.id());
    }
  }
  return ids;
}

int64_t WorkerRegistry::RecordsReadForTesting() const {
  AnnotatedMutexLock lock(&mu_);
  return records_read_;
}

absl::StatusOr<std::string> WorkerRegistry::NcclUniqueId(const std::string& worker_id) const {
  AnnotatedMutexLock lock(&mu_);
  const Entry* entry = FindLocked(worker_id);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", EchoInput(worker_id), " is not registered"));
  }
  return entry->nccl_unique_id;
}

bool WorkerRegistry::ConsumeNcclUniqueId(const std::string& worker_id, const std::string& id) {
  AnnotatedMutexLock lock(&mu_);
  Entry* entry = FindLocked(worker_id);
  if (entry == nullptr || id.empty() || entry->nccl_unique_id != id) return false;
  entry->consumed_nccl_id = id;
  entry->nccl_unique_id.clear();
  return true;
}

std::map<v1::WorkerState, int> WorkerRegistry::CountByState() const {
  AnnotatedMutexLock lock(&mu_);
  std::map<v1::WorkerState, int> counts;
  for (int state = v1::WORKER_STATE_JOINING; state <= v1::WORKER_STATE_LEFT; ++state) {
    counts[static_cast<v1::WorkerState>(state)] = counts_[state];
  }
  return counts;
}

bool WorkerRegistry::AwaitReadyCount(int n, absl::Duration timeout) const {
  AnnotatedMutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return counts_[v1::WORKER_STATE_READY] >= n;
  };
  return mu_.AwaitWithTimeout(enough, timeout);
}

// --------------------------------------------------------------- Assignment

absl::Status WorkerRegistry::Assign(const std::vector<std::string>& worker_ids,
                                    const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("Assign: job_id is empty");
  AnnotatedMutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckAssignableLocked(worker_ids));
  for (const std::string& id : worker_ids) {
    Entry* entry = FindLocked(id);
    SetStateLocked(*entry, v1::WORKER_STATE_ASSIGNED);
    entry->worker.set_job_id(job_id);
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckAssignableLocked(
    const std::vector<std::string>& worker_ids) const {
  if (worker_ids.empty()) return absl::InvalidArgumentError("Assign: no worker ids given");
  std::set<std::string> seen;
  for (const std::string& id : worker_ids) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("Assign: worker ", id, " is listed twice"));
    }
    const Entry* entry = FindLocked(id);
    if (entry == nullptr) {
      return absl::NotFoundError(absl::StrCat("Assign: worker ", id, " is not registered"));
    }
    const v1::Worker& worker = entry->worker;
    if (worker.state() != v1::WORKER_STATE_READY) {
      return absl::FailedPreconditionError(
          absl::StrCat("Assign: ", Describe(worker), " is ", EnumShortName(worker.state()),
                       worker.job_id().empty() ? "" : absl::StrCat(" (job ", worker.job_id(), ")"),
                       ", not READY; no worker was assigned"));
    }
  }
  return absl::OkStatus();
}

bool WorkerRegistry::StoppedSince(const std::string& worker_id, absl::Time since) const {
  AnnotatedMutexLock lock(&mu_);
  const Entry* entry = FindLocked(worker_id);
  if (entry == nullptr) return true;
  if (entry->restored_unheard) return false;
  return !IsLive(entry->worker.state()) || entry->last_idle >= since;
}

void WorkerRegistry::Release(const std::string& job_id) {
  AnnotatedMutexLock lock(&mu_);
  for (auto& [number, entry] : workers_) {
    if (entry.worker.job_id() != job_id) continue;
    entry.released_job = job_id;
    if (entry.worker.state() == v1::WORKER_STATE_ASSIGNED) {
      SetStateLocked(entry, v1::WORKER_STATE_READY);
      entry.worker.clear_job_id();
      // Its last report was this job's work: until it says it is idle, it
      // may be stopping still, or hung (heard from no more).
      if (!IsIdleInstruction(entry.worker.current_instruction())) {
        entry.stopping = true;
        entry.worker.set_current_instruction(
            absl::StrCat("stopping job ", job_id, " (no heartbeat since)"));
      }
    } else if (entry.worker.state() == v1::WORKER_STATE_LOST ||
               entry.worker.state() == v1::WORKER_STATE_LEFT) {
      // Gone while in the job: now that it is released, its job and last
      // instruction would read as current (pipetrain workers, the API).
      entry.worker.clear_job_id();
      entry.worker.clear_current_instruction();
    }
  }
}

// ------------------------------------------------------------------- Leases

void WorkerRegistry::Restore(const std::vector<v1::Worker>& all) {
  std::future<absl::Status> forgotten;
  {
    AnnotatedMutexLock lock(&mu_);
    RestoreLocked(all);
    forgotten = StoreWorkDoneLocked();
  }
  forgotten.wait();  // the records it dropped are gone from the store too
}

void WorkerRegistry::RestoreLocked(const std::vector<v1::Worker>& all) {
  const absl::Time now = clock_->Now();
  const absl::Time lease_now = lease_clock_->Now();
  // Those saved last, as many as the registry keeps: a store older than
  // the cap (or written under a larger one) does not grow it. A record's
  // heartbeat is the one it had when saved (registering, drained or
  // deregistering): heartbeats themselves are not saved.
  std::vector<v1::Worker> workers = all;
  std::stable_sort(workers.begin(), workers.end(), [](const v1::Worker& a, const v1::Worker& b) {
    return FromProtoTimestamp(a.last_heartbeat()) > FromProtoTimestamp(b.last_heartbeat());
  });
  // Records that cannot be restored are set aside first, so that they take
  // none of the room. A record whose address a newer one has is a worker
  // evicted for it whose delete failed (only logged): forgotten now.
  std::vector<v1::Worker> usable;
  std::set<std::string> addresses;
  std::set<int64_t> numbers;
  for (const v1::Worker& w : workers) {
    const int64_t number = WorkerIdNumber(w.id()).value_or(0);
    // Only ids as Register spells them ("w-01" parses as 1 too), each
    // once: two records on one entry would count it twice by state and
    // leave an address mapped to an entry another address then owns.
    if (number <= 0 || number > kMaxRestoredWorkerNumber || w.incarnation() < 0 ||
        w.incarnation() > kMaxRestoredWorkerNumber || w.data_address().empty() ||
        w.id() != absl::StrCat(kIdPrefix, number) || workers_.count(number) > 0 ||
        !numbers.insert(number).second) {
      PT_LOG(WARNING) << "not restoring worker record \"" << EchoInput(w.id()) << "\"";
      continue;
    }
    if (number_by_address_.count(w.data_address()) > 0 ||
        !addresses.insert(w.data_address()).second) {
      PT_LOG(WARNING) << "not restoring worker record \"" << EchoInput(w.id())
                      << "\": a newer one has its data address; forgetting it";
      ForgetLocked(w.id());
      continue;
    }
    usable.push_back(w);
    // Saved before RegisterWorker checked it: exported as a label again
    // only if Register would take it now.
    if (!CheckMetricsAddress(w.metrics_address()).ok()) usable.back().clear_metrics_address();
  }
  const size_t room = static_cast<size_t>(std::max(0, options_.max_workers)) > workers_.size()
                          ? static_cast<size_t>(options_.max_workers) - workers_.size()
                          : 0;
  if (usable.size() > room) {
    PT_LOG(WARNING) << "restoring the " << room << " of " << usable.size()
                    << " saved workers saved last (the registry's limit); forgetting the others";
    for (size_t i = room; i < usable.size(); ++i) {
      ForgetLocked(usable[i].id());
    }
    usable.resize(room);
  }
  for (const v1::Worker& w : usable) {
    const int64_t number = *WorkerIdNumber(w.id());
    // A worker saved as it deregistered stays LEFT, with its last
    // heartbeat. Any other may have been live when the old coordinator
    // stopped, or lost long before (a loss is not saved): they cannot be
    // told apart, so each is LOST and awaited (restored_unheard).
    const bool left = w.state() == v1::WORKER_STATE_LEFT;
    Entry& entry = workers_[number];
    entry.worker = w;
    entry.worker.clear_state();
    entry.worker.clear_job_id();
    entry.worker.clear_current_instruction();
    // Eviction takes the LEFT or LOST entry seen longest ago: a LEFT one was
    // last seen at its stored heartbeat, so it goes before the others (seen
    // now, and listed so), which EvictOneLocked skips for a lease anyway.
    entry.last_seen = now;
    entry.lease_start = lease_now;
    if (left) entry.last_seen = std::min(now, FromProtoTimestamp(w.last_heartbeat()));
    if (!left) *entry.worker.mutable_last_heartbeat() = ToProtoTimestamp(now);
    number_by_address_[w.data_address()] = number;
    last_number_ = std::max(last_number_, number);
    // Known, not live: it must register again (its session died with the
    // old coordinator). A secret nobody holds: the stored record has none,
    // and an empty one would let anyone present "w-N.<incarnation>." as
    // this worker's session.
    entry.session_secret = RandomToken();
    SetStateLocked(entry, v1::WORKER_STATE_JOINING);
    SetStateLocked(entry, left ? v1::WORKER_STATE_LEFT : v1::WORKER_STATE_LOST);
    entry.restored_unheard = !left;
    entry.restored_at = lease_now;
  }
}

bool WorkerRegistry::RestoredUnheard(const std::string& worker_id) const {
  AnnotatedMutexLock lock(&mu_);
  const Entry* entry = FindLocked(worker_id);
  return entry != nullptr && entry->restored_unheard &&
         entry->worker.state() == v1::WORKER_STATE_LOST;
}

absl::Status WorkerRegistry::MarkDrained(const std::string& worker_id, int64_t incarnation) {
  std::future<absl::Status> saving;
  {
    AnnotatedMutexLock lock(&mu_);
    Entry* entry = FindLocked(worker_id);
    if (entry == nullptr || entry->worker.incarnation() != incarnation) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " incarnation ",
                                                        incarnation, " is no longer registered"));
    }
    entry->worker.set_drained(true);
    saving = SaveLocked(entry->worker);
  }
  absl::Status saved = saving.get();  // off the lock
  if (saved.ok()) return saved;
  // UNAVAILABLE whatever the store's code: FAILED_PRECONDITION here says the
  // incarnation is gone, and an etcd fence refusing a deposed leader's
  // write answers FAILED_PRECONDITION too ("not the leader").
  return absl::UnavailableError(absl::StrCat("state store: ", saved.message()));
}

std::future<absl::Status> WorkerRegistry::SaveLocked(const v1::Worker& worker) {
  if (!options_.persist) return StoreWorkDoneLocked();
  auto saved = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = saved->get_future();
  store_queue_.Post([this, worker, saved] {
    absl::Status status = options_.persist(worker);
    if (!status.ok()) {
      PT_LOG(WARNING) << "could not save " << Describe(worker) << " ("
                      << EnumShortName(worker.state()) << "): " << status;
    }
    // Moved: this thread keeps no reference to the status's message once
    // the waiter may have it (its count is in Debian's uninstrumented
    // Abseil, where TSan cannot see the two threads agree).
    saved->set_value(std::move(status));
  });
  return result;
}

std::future<absl::Status> WorkerRegistry::StoreWorkDoneLocked() {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  store_queue_.Post([done] { done->set_value(absl::OkStatus()); });
  return result;
}

void WorkerRegistry::ForgetLocked(const std::string& worker_id) {
  if (!options_.forget) return;
  store_queue_.Post([this, worker_id] { options_.forget(worker_id); });
}

void WorkerRegistry::MarkLost(const std::string& worker_id, int64_t incarnation,
                              const std::string& why) {
  std::vector<Loss> losses;
  LossListener listener;
  {
    AnnotatedMutexLock lock(&mu_);
    Entry* entry = FindLocked(worker_id);
    if (entry == nullptr || entry->worker.incarnation() != incarnation ||
        !IsLive(entry->worker.state())) {
      return;
    }
    if (entry->worker.state() == v1::WORKER_STATE_ASSIGNED) {
      losses.push_back({worker_id, entry->worker.job_id(),
                        absl::StrCat(Describe(entry->worker), " is gone: ", why), incarnation});
    } else {
      LogIdleWorkerLost(entry->worker, why);
    }
    SetStateLocked(*entry, v1::WORKER_STATE_LOST);
    entry->lost_why = why;
    listener = listener_;
  }
  Notify(listener, losses);
}

int WorkerRegistry::CheckLeases() {
  std::vector<Loss> losses;
  LossListener listener;
  int lost = 0;
  {
    AnnotatedMutexLock lock(&mu_);
    const absl::Time now = lease_clock_->Now();
    for (auto& [number, entry] : workers_) {
      const v1::Worker& worker = entry.worker;
      const absl::Duration silent = now - entry.lease_start;
      // JOINING: its registration is being saved, and it heartbeats only
      // once Register returns (a save longer than the lease would
      // otherwise lose every registration it made).
      if (!IsLive(worker.state()) || worker.state() == v1::WORKER_STATE_JOINING ||
          silent <= options_.lease) {
        continue;
      }
      const std::string missed = absl::StrCat(
          "missed heartbeats for ", absl::FormatDuration(silent), " (lease ",
          absl::FormatDuration(options_.lease), "); it crashed or was preempted; check its log");
      if (worker.state() == v1::WORKER_STATE_ASSIGNED) {
        losses.push_back({worker.id(), worker.job_id(), absl::StrCat(Describe(worker), " ", missed),
                          worker.incarnation()});
      } else {
        LogIdleWorkerLost(worker, missed);
      }
      SetStateLocked(entry, v1::WORKER_STATE_LOST);
      entry.lost_why = "its lease expired before this heartbeat arrived";
      ++lost;
    }
    listener = listener_;
  }
  Notify(listener, losses);
  return lost;
}

void WorkerRegistry::SetLossListener(LossListener listener) {
  AnnotatedMutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void WorkerRegistry::Notify(const LossListener& listener, const std::vector<Loss>& losses) {
  if (!listener) return;
  for (const Loss& loss : losses) {
    listener(loss.worker_id, loss.job_id, loss.reason, loss.incarnation);
  }
}

void WorkerRegistry::SetStateLocked(Entry& entry, v1::WorkerState to) {
  const v1::WorkerState from = entry.worker.state();
  PT_CHECK(IsLegalTransition(from, to)) << entry.worker.id() << ": illegal transition "
                                        << EnumShortName(from) << " -> " << EnumShortName(to);
  if (from != v1::WORKER_STATE_UNSPECIFIED) --counts_[from];
  ++counts_[to];
  entry.worker.set_state(to);
}

void WorkerRegistry::TouchLocked(Entry& entry, absl::Time now) {
  entry.last_seen = now;
  entry.lease_start = lease_clock_->Now();
  *entry.worker.mutable_last_heartbeat() = ToProtoTimestamp(now);
}

// ---------------------------------------------------------- Staleness loop

void WorkerRegistry::StartStalenessLoop() {
  AnnotatedMutexLock lock(&loop_mu_);
  if (loop_.joinable()) return;
  {
    AnnotatedMutexLock state_lock(&mu_);
    stop_requested_ = false;
  }
  loop_ = std::thread([this] { RunStalenessLoop(); });
}

void WorkerRegistry::Stop() {
  AnnotatedMutexLock lock(&loop_mu_);
  if (!loop_.joinable()) return;
  {
    AnnotatedMutexLock state_lock(&mu_);
    stop_requested_ = true;
  }
  loop_.join();
}

bool WorkerRegistry::CheckerWasStalled(absl::Duration since_last, absl::Duration period,
                                       absl::Duration lease) {
  return since_last > period + lease / 2;
}

void WorkerRegistry::RenewLeasesAfterStall(absl::Duration stalled) {
  AnnotatedMutexLock lock(&mu_);
  const absl::Time now = lease_clock_->Now();
  int renewed = 0;
  for (auto& [number, entry] : workers_) {
    if (!IsLive(entry.worker.state())) continue;
    entry.lease_start = now;  // the heartbeat timestamps shown stay the real ones
    ++renewed;
  }
  PT_LOG(WARNING) << "the coordinator was stalled: its lease check ran "
                  << absl::FormatDuration(stalled)
                  << " after the one before, and no heartbeat could be taken meanwhile; the "
                  << renewed << " live workers' leases start again now";
}

void WorkerRegistry::RunStalenessLoop() {
  const absl::Duration period = options_.heartbeat_interval / 2;
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_requested_; };
  // A monotonic clock: a wall-clock step (NTP) is not a stall.
  auto now = [] { return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch()); };
  absl::Duration last_check = now();
  for (;;) {
    {
      AnnotatedMutexLock lock(&mu_);
      // Waits on real time: the injected clock only judges the leases.
      if (mu_.AwaitWithTimeout(stopping, period)) return;
    }
    // A check far later than asked means this process was not running
    // (its heartbeat handlers neither): judging leases now would blame the
    // workers for the coordinator's stall and fail their jobs.
    const absl::Duration checked = now();
    if (CheckerWasStalled(checked - last_check, period, options_.lease)) {
      RenewLeasesAfterStall(checked - last_check);
    }
    last_check = checked;
    CheckLeases();
  }
}

}  // namespace pipetrain
