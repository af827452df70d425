#include "worker/agent/worker_agent.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/build_identity.h"
#include "common/coordinator_endpoints.h"
#include "common/grpc_credentials.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/loopback_channel.h"
#include "common/secrets.h"
#include "worker/agent/coordinator_channel.h"
#include "worker/agent/device_info.h"
#include "worker/agent/drain_retry.h"
#include "worker/agent/worker_metrics.h"

namespace pipetrain {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// What RegisterWorker answers when it would refuse the same request again:
// the join token (UNAUTHENTICATED), a fact out of bounds (INVALID_ARGUMENT)
// or this worker's build (FAILED_PRECONDITION, not the coordinator's). Not
// RESOURCE_EXHAUSTED: a registry at its most workers may have room later.
// Nor UNIMPLEMENTED, which RegisterWithRetry refuses only at the first
// registration (see there).
bool IsRegistrationRefusal(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::FAILED_PRECONDITION;
}

// OK, or INTERNAL when a RegisterWorker answer cannot be used: its session
// token goes into every later call's metadata, where gRPC aborts the process
// on a byte that is not printable ASCII, so it is checked as the join token
// is (CheckedSecret), and taken exactly (CheckedSecret drops a trailing line
// end, which a file holds; the coordinator compares every byte). Not a
// refusal: a buggy or mixed-version coordinator's answer, retried. The
// message names the field, never the value.
grpc::Status UsableRegistration(const v1::RegisterWorkerResponse& response) {
  constexpr absl::string_view kField = "RegisterWorkerResponse.session_token";
  const std::string& token = response.session_token();
  absl::StatusOr<std::string> checked = CheckedSecret(kField, token);
  if (checked.ok() && *checked == token) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat("the coordinator's answer is unusable: ",
                                   checked.ok() ? absl::StrCat(kField, " ends in a line end")
                                                : std::string(checked.status().message()),
                                   " (a coordinator of another build?)"));
}

constexpr int kValuesPerChunk = 256 * 1024;  // 1 MiB of floats per message

// Counts a failed call to the coordinator in `metrics` (may be null).
void CountFailure(WorkerMetrics* metrics, WorkerMetrics::CoordinatorCall call,
                  const grpc::Status& s) {
  if (metrics != nullptr && !s.ok()) metrics->CoordinatorCallFailed(call, s.error_code());
}

// Failures in a row of one kind of call to the coordinator, and which to
// log: the first at once, then at most one a minute saying how many were
// not (LogRateLimiter); the success that ends them is worth a line when
// one of them was logged. A line at every heartbeat (each second, on every
// worker) made a 10-minute outage of 4096 workers about 2.5 M lines. Not
// thread-safe: one thread's calls.
class FailureStretch {
 public:
  explicit FailureStretch(Clock* clock) : clock_(clock) {}

  // Counts a failure; whether to log it, then with
  // LogRateLimiter::Dropped(*dropped).
  bool Failed(int64_t* dropped) {
    Count();
    const bool allowed = limiter_->Allow(dropped);
    logged_ = logged_ || allowed;
    return allowed;
  }
  // Counts a failure that is not to be logged (a heartbeat sent again at
  // once after it): the next Failed of the stretch is still logged at once.
  void Count() {
    if (failures_++ == 0) {
      since_ = clock_->Now();
      limiter_.emplace(1, absl::Minutes(1), clock_);
    }
  }
  // Ends the stretch: "" when nothing failed or nothing of it was logged
  // (one beat refused by a follower, then answered by the leader it
  // named), else "after N failed <what> over D".
  std::string Ended(absl::string_view what) {
    std::string said;
    if (logged_) {
      said = absl::StrCat("after ", failures_, " failed ", what, " over ",
                          absl::FormatDuration(clock_->Now() - since_));
    }
    failures_ = 0;
    logged_ = false;
    limiter_.reset();
    return said;
  }

 private:
  Clock* const clock_;
  int64_t failures_ = 0;
  bool logged_ = false;  // a failure of this stretch was logged
  absl::Time since_;
  // The stretch's own, so that its first failure is logged at once.
  std::optional<LogRateLimiter> limiter_;
};

}  // namespace

absl::Duration WeightsUploadDeadline(int64_t bytes) {
  return std::max(absl::Minutes(10),
                  absl::Seconds(static_cast<double>(std::max<int64_t>(0, bytes)) /
                                kWeightsUploadFloorBytesPerSecond));
}

absl::Duration HeartbeatDeadline(absl::Duration rpc_timeout, absl::Duration lease,
                                 absl::Duration interval) {
  if (!(lease > absl::ZeroDuration())) return rpc_timeout;
  // The beat after one given up leaves its deadline plus an interval after
  // it, and must be recorded within the lease of it: one interval is left
  // for its way there (the lease counts from when a beat is recorded). Not
  // under an interval: with an interval over a third of the lease no
  // deadline leaves that margin, and a beat must have time to be answered.
  return std::min(rpc_timeout, std::max(interval, lease - 2 * interval));
}

// CoordinatorLink over the coordinator's gRPC service.
class WorkerAgent::GrpcLink : public CoordinatorLink {
 public:
  explicit GrpcLink(WorkerAgent* agent) : agent_(agent) {}

  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request) override {
    grpc::ClientContext context;
    SetDeadline(&context, agent_->options_.rpc_timeout);
    AddBearer(context, agent_->session_->Get());
    v1::ReportProgressResponse response;
    const CoordinatorStub coordinator = agent_->Stub();
    const grpc::Status s = coordinator.stub->ReportProgress(&context, request, &response);
    CountFailure(agent_->options_.metrics, WorkerMetrics::CoordinatorCall::kReport, s);
    if (!s.ok()) agent_->endpoints_->Failed(s, context, coordinator.channel);
    if (!s.ok()) return FromGrpc(s);
    return response;
  }

  absl::Status UploadWeights(const std::string& job_id, const std::vector<Parameter*>& params,
                             CallCancel* cancel) override {
    grpc::ClientContext context;
    const CallCancel::Scope cancellable(cancel, [&context] { context.TryCancel(); });
    if (!cancellable.active()) return absl::CancelledError("the weights upload was cancelled");
    int64_t bytes = 0;
    for (const Parameter* p : params) bytes += p->value.numel() * int64_t{sizeof(float)};
    SetDeadline(&context, WeightsUploadDeadline(bytes));
    AddBearer(context, agent_->session_->Get());
    v1::UploadWeightsResponse response;
    const CoordinatorStub coordinator = agent_->Stub();
    auto writer = coordinator.stub->UploadWeights(&context, &response);
    const std::string worker = agent_->worker_id();
    if (params.empty()) {  // a forward-only stage: name the stream, no tensors
      v1::WeightsChunk chunk;
      chunk.set_worker_id(worker);
      chunk.set_job_id(job_id);
      if (!writer->Write(chunk)) return FromGrpc(writer->Finish());
    }
    for (const Parameter* p : params) {
      const int64_t n = p->value.numel();
      for (int64_t offset = 0; offset == 0 || offset < n; offset += kValuesPerChunk) {
        v1::WeightsChunk chunk;
        chunk.set_worker_id(worker);
        chunk.set_job_id(job_id);
        chunk.set_tensor_name(p->name);
        for (int64_t d : p->value.shape()) chunk.add_shape(d);
        chunk.set_offset(offset);
        const int64_t count = std::min<int64_t>(kValuesPerChunk, n - offset);
        chunk.mutable_values()->Add(p->value.data() + offset, p->value.data() + offset + count);
        if (!writer->Write(chunk)) return FromGrpc(writer->Finish());
        if (n == 0) break;
      }
    }
    writer->WritesDone();
    return FromGrpc(writer->Finish());
  }

 private:
  WorkerAgent* agent_;
};

WorkerAgent::WorkerAgent(WorkerAgentOptions options, DataPlaneServer* data_plane, Mailbox* mailbox,
                         TransportFactory make_transport, IterationObserver observer)
    : options_(std::move(options)),
      data_plane_(data_plane),
      mailbox_(mailbox),
      make_transport_(std::move(make_transport)),
      observer_(std::move(observer)),
      session_(options_.session != nullptr ? options_.session : &own_session_) {
  auto credentials =
      options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
  // Reconnecting within 2 s, and pinging a coordinator that may have
  // vanished without closing the connection (coordinator_channel.h).
  const grpc::ChannelArguments args = CoordinatorChannelArguments();
  // Several addresses: highly available coordinators; calls follow the
  // leader (common/coordinator_endpoints.h).
  std::vector<std::string> addresses =
      ParseCoordinatorAddresses("--coordinator", options_.coordinator_address)
          .value_or(std::vector<std::string>{options_.coordinator_address});
  endpoints_ = std::make_unique<CoordinatorEndpoints>(
      std::move(addresses),
      [credentials, args](const std::string& address) {
        return CreateCustomChannelSkippingLoopbackProxy(address, credentials, args);
      },
      options_.clock);
  link_ = std::make_unique<GrpcLink>(this);
  device_ = CollectDeviceInfo(options_.backend);
  device_.set_memory_limit_bytes(
      EffectiveMemoryLimit(device_.memory_limit_bytes(), 0, options_.memory_limit_bytes));
  device_.set_memory_reserve_bytes(options_.memory_reserve_bytes);
  device_.set_gpu_index(options_.backend->device_facts().index);
  device_.set_link_bandwidth_bytes_per_second(options_.emulated_bandwidth_bytes_per_second);
  device_.set_link_latency_seconds(options_.emulated_latency_seconds);
  device_.set_data_plane_overhead_seconds(options_.data_plane_overhead_seconds);
  device_.set_data_plane_bytes_per_second(options_.data_plane_bytes_per_second);
  absl::StatusOr<std::string> group_id = options_.backend->NewDeviceGroupId();
  if (group_id.ok()) {
    AnnotatedMutexLock lock(&mu_);
    group_id_ = *std::move(group_id);
  } else if (group_id.status().code() != absl::StatusCode::kUnimplemented) {
    PT_LOG(WARNING) << "no NCCL id: this worker's links stay on gRPC (" << group_id.status() << ")";
  }
}

std::string WorkerAgent::GroupIdToReport() {
  {
    AnnotatedMutexLock lock(&mu_);
    if (!group_id_used_) return group_id_unreported_ ? group_id_ : "";
    group_id_used_ = false;
    group_id_.clear();
  }
  absl::StatusOr<std::string> fresh = options_.backend->NewDeviceGroupId();
  if (!fresh.ok()) {
    PT_LOG(WARNING) << "no new NCCL id: this worker seeds no more device groups (" << fresh.status()
                    << ")";
    return "";
  }
  AnnotatedMutexLock lock(&mu_);
  group_id_ = *fresh;
  group_id_unreported_ = true;
  return *std::move(fresh);
}

WorkerAgent::~WorkerAgent() { Stop(); }

std::string WorkerAgent::worker_id() const {
  AnnotatedMutexLock lock(&mu_);
  return worker_id_;
}

std::string WorkerAgent::current_instruction() const { return InstructionAndLastJob().first; }

bool WorkerAgent::AwaitDrainWaitingForTesting(absl::Duration timeout) const {
  AnnotatedMutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return drain_waiters_ > 0; }, timeout);
}

bool WorkerAgent::AwaitRegistrationBackoffForTesting(absl::Duration timeout) const {
  AnnotatedMutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registration_backoffs_ > 0; }, timeout);
}

absl::Duration WorkerAgent::ReportRetryFor() const {
  AnnotatedMutexLock lock(&mu_);
  return ReportRetryForLease(lease_, heartbeat_interval_);
}

std::pair<std::string, std::string> WorkerAgent::InstructionAndLastJob() const {
  AnnotatedMutexLock lock(&mu_);
  if (runner_) return {runner_->current_instruction(), runner_->assignment().job_id()};
  // "idle" tells the coordinator that a released worker may be given the
  // next job (WorkerRegistry::Release): not while a stop still runs, nor
  // (the job named with it) before it took the job's assignment.
  return {stopping_job_.empty() ? "idle" : absl::StrCat("stopping job ", stopping_job_),
          last_job_id_};
}

bool WorkerAgent::SleepUnlessStopped(absl::Duration d) {
  AnnotatedMutexLock lock(&mu_);
  return !mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                               d);
}

absl::Status WorkerAgent::RegisterWithRetry(CallCancel* cancel, bool first) {
  Backoff backoff(options_.backoff);
  GroupIdToReport();  // a used id must not be offered again
  v1::RegisterWorkerRequest request;
  request.set_join_token(options_.join_token);
  *request.mutable_device() = device_;
  {
    AnnotatedMutexLock lock(&mu_);
    request.mutable_device()->set_nccl_unique_id(group_id_);
  }
  request.set_data_address(data_plane_->address());
  request.set_metrics_address(options_.metrics_address);
  request.set_node_name(options_.node_name);
  *request.mutable_build() = ThisBuild();
  request.set_data_plane_tls(options_.data_plane_tls);
  {
    AnnotatedMutexLock lock(&mu_);
    // 0 before the first registration: a new process.
    request.set_previous_incarnation(incarnation_);
  }
  // The same in every retry of this registration: one whose first attempt
  // went through (its answer lost to a deadline) is answered with the
  // incarnation that attempt made, not a new one.
  request.set_registration_id(RandomHex(16));
  // An attempt that failed otherwise than by a refusal (a deadline, a lost
  // connection) may yet commit on the coordinator: stopped after one, the
  // registration is settled as one cut off is (SettleCutOffRegistration).
  bool maybe_committed = false;
  const auto stopped = [&]() {
    if (maybe_committed) SettleCutOffRegistration(request, Stub());
    return absl::CancelledError("stopped before registering");
  };
  std::set<std::string> not_serving;  // listed addresses that answered UNIMPLEMENTED
  FailureStretch failures(options_.clock);
  while (true) {
    bool stopping = false;
    {
      AnnotatedMutexLock lock(&mu_);
      stopping = stopping_;
      // Read at every attempt: a drain asked for while registering (a
      // SIGTERM while the coordinator was unreachable) goes with the next.
      request.set_drained(drained_);
    }
    if (stopping) return stopped();
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    v1::RegisterWorkerResponse response;
    const std::string address = endpoints_->current();  // before Failed moves on
    const CoordinatorStub coordinator = Stub();
    // Cancelled by Leave (`cancel`, the heartbeat thread's), as a heartbeat
    // is: a slow coordinator held the shutdown for up to rpc_timeout, past
    // the stop bound, and the process exited without deregistering. A
    // registration cut off may yet be committed, though, leaving a READY
    // incarnation no one deregisters until its lease ends: asked once more,
    // the coordinator names it, and Leave deregisters it (best effort: the
    // second asking has half of kDeregisterTimeout, SettleCutOffRegistration).
    grpc::Status s;
    {
      const CallCancel::Scope cancellable(cancel, [&context] { context.TryCancel(); });
      if (!cancellable.active()) return stopped();
      s = coordinator.stub->RegisterWorker(&context, request, &response);
    }
    // Taken as a failed attempt that committed: backed off and retried
    // under a new registration id, which supersedes the incarnation the
    // answer made (the same id was answered with the same unusable token,
    // and each retry renewed the lease of an incarnation nobody held).
    if (s.ok()) {
      s = UsableRegistration(response);
      if (!s.ok()) request.set_registration_id(RandomHex(16));
    }
    if (!s.ok() && cancel != nullptr && cancel->cancelled()) {
      SettleCutOffRegistration(request, coordinator);
      return absl::CancelledError("stopped while registering");
    }
    CountFailure(options_.metrics, WorkerMetrics::CoordinatorCall::kRegister, s);
    if (!s.ok()) endpoints_->Failed(s, context, coordinator.channel);
    if (s.ok()) {
      const std::string after = failures.Ended("registration attempts");
      if (!after.empty()) PT_LOG(INFO) << "coordinator reachable again " << after;
      bool drain_now = false;
      {
        AnnotatedMutexLock lock(&mu_);
        RecordRegistrationLocked(request, response);
        // A drain asked for after this request left: ask for it now; not
        // when leaving (Leave deregisters next, which says more, and the
        // drain's two calls of up to rpc_timeout each would eat into the
        // stop bound).
        drain_now = drained_ && !request.drained() && !stopping_;
      }
      if (drain_now) {
        // Under `cancel` too: a Leave meanwhile must not wait for it.
        const absl::Status drained = RequestDrain(cancel);
        if (!drained.ok()) PT_LOG(WARNING) << "cannot drain after registering: " << drained;
      }
      return absl::OkStatus();
    }
    // Not a coordinator at all: no attempt reached RegisterWorker, so none
    // may have committed. At the first registration, a wrong --coordinator:
    // said so, naming the address (gRPC's own message, "unknown service
    // ...", or none, does not say which flag is wrong). Registering again,
    // the address served the coordinator a moment ago: a proxy in front of
    // it (nginx, Envoy, Istio) answering 404, which gRPC reports as
    // UNIMPLEMENTED, during a rollout. Retried as an outage is: a worker
    // that exited there would drop its stage.
    // With several addresses listed, the next is tried (Failed moved on)
    // until every one has answered so.
    const bool not_served = s.error_code() == grpc::StatusCode::UNIMPLEMENTED;
    if (not_served) not_serving.insert(address);
    if (not_served && first && not_serving.size() >= endpoints_->size()) {
      return absl::UnimplementedError(absl::StrCat(
          address, " does not serve the coordinator's API (RegisterWorker: ",
          s.error_message().empty() ? "UNIMPLEMENTED" : s.error_message(),
          "): --coordinator must name a coordinator's --grpc-address, not a worker's --listen "
          "port, etcd or another gRPC service"));
    }
    // The coordinator refuses the join token, what this request says of
    // the worker (a --node-name or device fact out of its bounds), or this
    // worker's build (not the coordinator's): the same request would be
    // refused again.
    if (IsRegistrationRefusal(s.error_code())) {
      return FromGrpc(s);
    }
    if (!not_served) maybe_committed = true;
    const absl::Duration wait = backoff.Next();
    // The first failed attempt, then one a minute: the backoff's 5 s
    // between attempts still made 120 lines per worker in a 10-minute outage.
    if (int64_t dropped = 0; failures.Failed(&dropped)) {
      const std::string hint =
          not_served ? "it does not serve the coordinator's API now (a proxy in front of it, "
                       "during a rollout?)"
                     : CoordinatorConnectionHint(s.error_message(), options_.coordinator_tls);
      PT_LOG(WARNING) << "cannot register with " << options_.coordinator_address << " ("
                      << s.error_message() << (hint.empty() ? "" : "; " + hint) << "); retrying in "
                      << absl::FormatDuration(wait) << " (logged once a minute until registered)"
                      << LogRateLimiter::Dropped(dropped);
    }
    {
      AnnotatedMutexLock lock(&mu_);
      ++registration_backoffs_;
    }
    if (!SleepUnlessStopped(wait)) return stopped();
  }
}

void WorkerAgent::SettleCutOffRegistration(v1::RegisterWorkerRequest request,
                                           const CoordinatorStub& coordinator) {
  // Drained: nothing is placed on what this makes in the moment before
  // Leave deregisters it. A cut-off attempt that committed undrained is then
  // superseded rather than answered again, which ends it all the same.
  request.set_drained(true);
  grpc::ClientContext context;
  SetDeadline(&context, std::min(options_.rpc_timeout, kDeregisterTimeout) / 2);
  v1::RegisterWorkerResponse response;
  grpc::Status s = coordinator.stub->RegisterWorker(&context, request, &response);
  if (s.ok()) s = UsableRegistration(response);
  AnnotatedMutexLock lock(&mu_);
  settled_registration_ = true;
  if (s.ok()) {
    RecordRegistrationLocked(request, response);
    return;
  }
  PT_LOG(WARNING) << "leaving while registering, and the coordinator did not answer again ("
                  << s.error_message() << "): an incarnation the registration may have made "
                  << "is marked LOST after its lease";
}

void WorkerAgent::RecordRegistrationLocked(const v1::RegisterWorkerRequest& request,
                                           const v1::RegisterWorkerResponse& response) {
  worker_id_ = response.worker_id();
  incarnation_ = response.incarnation();
  session_->Set(response.session_token());
  if (group_id_ == request.device().nccl_unique_id()) group_id_unreported_ = false;
  heartbeat_interval_ = absl::Seconds(std::max(0.05, response.heartbeat_interval_seconds()));
  // Bounded where used (ReportRetryForLease); NaN is no duration.
  lease_ = std::isfinite(response.lease_seconds()) && response.lease_seconds() > 0
               ? absl::Seconds(std::min(response.lease_seconds(), 1e7))
               : absl::ZeroDuration();
  ++registrations_;  // wakes a watch loop waiting out its backoff
  PT_LOG(INFO) << "registered as " << worker_id_ << " (incarnation " << incarnation_
               << "), data plane " << data_plane_->address()
               << (request.drained() ? "; drained" : "");
}

absl::Status WorkerAgent::Start() {
  // Not cancelled by Leave, which does not wait for it: answered, it is
  // deregistered below.
  absl::Status registered = RegisterWithRetry(nullptr, /*first=*/true);
  if (absl::IsCancelled(registered)) {
    // Stopped after an attempt that may have committed: what the settling
    // named, if anything, is deregistered (Stop's Deregister found no id).
    Deregister();
    return registered;
  }
  if (!registered.ok()) return registered;
  {
    // Stop() (another thread, on a signal) sets stopping_ under mu_ before
    // it looks at the threads: they are started before that or not at all.
    AnnotatedMutexLock lock(&mu_);
    if (!stopping_) {
      heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
      watch_thread_ = std::thread([this] { WatchLoop(); });
      return absl::OkStatus();
    }
  }
  // Stopped while the registration was answered: Stop's Deregister found
  // no id yet, so this one says goodbye.
  Deregister();
  return absl::CancelledError("stopped while registering");
}

WorkerAgent::CoordinatorStub WorkerAgent::Stub() {
  CoordinatorStub out;
  out.channel = endpoints_->channel();
  out.stub = v1::CoordinatorService::NewStub(out.channel);
  return out;
}

template <typename Rpc>
grpc::Status WorkerAgent::CallLeader(absl::Duration timeout, Rpc rpc, CallCancel* cancel) {
  grpc::Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    AddBearer(context, session_->Get());
    const CoordinatorStub coordinator = Stub();
    const CallCancel::Scope cancellable(cancel, [&context] { context.TryCancel(); });
    if (!cancellable.active()) return grpc::Status(grpc::StatusCode::CANCELLED, "stopped");
    s = rpc(*coordinator.stub, &context);
    if (s.ok() || s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    endpoints_->Failed(s, context, coordinator.channel);
  }
  return s;
}

absl::Status WorkerAgent::RequestDrain(CallCancel* cancel) {
  bool granted = false;
  const absl::Status asked = AskDrain(options_.rpc_timeout, cancel, &granted);
  // Not before a registration (none may ever come: a start-up refused):
  // nothing was drained, and the registration says drained when it comes.
  if (granted) PT_LOG(INFO) << "drained: no job is placed on this worker from now on";
  return asked;
}

absl::Status WorkerAgent::AwaitRegisteredAgain(absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu_);
  if (stale_drain_registration_ == 0) return absl::OkStatus();
  mu_.AwaitWithTimeout(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return registrations_ > stale_drain_registration_ || stopping_ ||
               !registration_refused_.ok();
      },
      timeout);
  if (registrations_ > stale_drain_registration_) return absl::OkStatus();
  // The heartbeat loop gave up: no registration comes.
  if (!registration_refused_.ok()) {
    return absl::Status(registration_refused_.code(),
                        absl::StrCat("the coordinator refused this worker's registration again: ",
                                     registration_refused_.message()));
  }
  if (stopping_) return absl::CancelledError("stopped before registering again");
  // Not naming `timeout`: a caller waiting in slices names its own.
  return absl::DeadlineExceededError(
      "not registered again since the coordinator refused this worker's session as stale (it "
      "restarted or failed over; see the heartbeat and registration warnings)");
}

absl::Status WorkerAgent::RecheckDrain() {
  {
    AnnotatedMutexLock lock(&mu_);
    if (assigned_job_.empty()) return absl::OkStatus();
  }
  // Short: the caller is waiting out its drain and listening for signals.
  return AskDrain(std::min(options_.rpc_timeout, kRecheckDrainTimeout));
}

absl::Status WorkerAgent::AskDrain(absl::Duration timeout, CallCancel* cancel, bool* granted) {
  if (granted != nullptr) *granted = false;
  v1::DrainWorkerRequest request;
  // The registration whose session the call sends (CallLeader reads the
  // session later: a registration meanwhile only makes the wait for one
  // past it, AwaitRegisteredAgain, end at once).
  int64_t registration = 0;
  {
    AnnotatedMutexLock lock(&mu_);
    // Idle too: a READY worker that is leaving must not be given a job (or
    // taken as a spare) while it serves on.
    // Every registration from now on says drained (RegisterWithRetry reads
    // drained_ at every attempt, and drains at once after one that left
    // before this): also when the call below fails because the coordinator
    // forgot this worker (restarted, or its lease ran out) and it registers
    // again, which would otherwise make it READY while it is leaving.
    drained_ = true;
    if (worker_id_.empty()) return absl::OkStatus();  // not registered yet
    request.set_worker_id(worker_id_);
    registration = registrations_;
  }
  v1::Worker response;
  const grpc::Status s = CallLeader(
      timeout,
      [&](v1::CoordinatorService::Stub& stub, grpc::ClientContext* context) {
        return stub.DrainWorker(context, request, &response);
      },
      cancel);
  if (!s.ok()) {
    const absl::Status refused(
        static_cast<absl::StatusCode>(s.error_code()),
        absl::StrCat("the coordinator would not drain this worker: ", s.error_message()));
    if (IsStaleSessionRefusal(refused)) {
      AnnotatedMutexLock lock(&mu_);
      stale_drain_registration_ = std::max(stale_drain_registration_, registration);
    }
    return refused;
  }
  if (granted != nullptr) *granted = true;
  AnnotatedMutexLock lock(&mu_);
  // Bounded: a job id is at most what the coordinator made it.
  const bool waiting_for_a_run =
      response.state() == v1::WORKER_STATE_ASSIGNED && !response.job_id().empty() &&
      (runner_ == nullptr || runner_->assignment().job_id() != response.job_id());
  assigned_job_ = waiting_for_a_run ? response.job_id().substr(0, 256) : "";
  return absl::OkStatus();
}

absl::Status WorkerAgent::AwaitDrained(absl::Duration timeout) {
  {
    AnnotatedMutexLock lock(&mu_);
    if (LetGoLocked()) return absl::OkStatus();
  }
  // The job's next plan STOPs this worker (StopRunner clears runner_).
  AnnotatedMutexLock lock(&mu_);
  ++drain_waiters_;
  const bool released = mu_.AwaitWithTimeout(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return LetGoLocked() || stopping_; }, timeout);
  --drain_waiters_;
  if (!released) {
    return absl::DeadlineExceededError(
        absl::StrCat("the job did not let this worker go within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

bool WorkerAgent::LetGoLocked() const {
  // A RUN being taken (runner_ may still hold the job before it, completed)
  // or a job the drain's answer named that has not run here yet.
  if (replacing_runner_ || !assigned_job_.empty()) return false;
  return runner_ == nullptr || runner_->completed();
}

void WorkerAgent::Stop() {
  Leave();
  StopRunner();
}

void WorkerAgent::Leave() {
  {
    AnnotatedMutexLock lock(&mu_);
    if (stopping_ && !heartbeat_thread_.joinable() && !watch_thread_.joinable()) return;
    stopping_ = true;  // no heartbeat re-registers, no watch reopens from now on
  }
  // The heartbeat thread's call in flight: a heartbeat, or a registration
  // again, which that thread settles (SettleCutOffRegistration) before it
  // ends, so that the Deregister below names what it may have made.
  heartbeat_cancel_.Cancel();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  // Deregistered before the assignment stream closes: the coordinator
  // would take a closed stream for a lost worker, and a job this one runs
  // would fail saying "its assignment stream closed", not that it was shut
  // down. A STOP that comes meanwhile leaves the runner to Stop() (Handle).
  Deregister();
  {
    AnnotatedMutexLock lock(&mu_);
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (watch_thread_.joinable()) watch_thread_.join();
}

// A clean shutdown says so, so the coordinator shows this worker LEFT at
// once instead of LOST after its lease (and alerts stay quiet). Best
// effort: a coordinator that cannot be reached finds out by the lease.
void WorkerAgent::Deregister() {
  v1::DeregisterWorkerRequest request;
  absl::Duration timeout = std::min(options_.rpc_timeout, kDeregisterTimeout);
  {
    AnnotatedMutexLock lock(&mu_);
    if (worker_id_.empty() || deregistered_) return;
    deregistered_ = true;
    request.set_worker_id(worker_id_);
    request.set_incarnation(incarnation_);
    // The other half after SettleCutOffRegistration: the shutdown's
    // watchdog reserves one kDeregisterTimeout for both.
    if (settled_registration_) timeout -= timeout / 2;
  }
  v1::DeregisterWorkerResponse response;
  const grpc::Status s =
      CallLeader(timeout, [&](v1::CoordinatorService::Stub& stub, grpc::ClientContext* context) {
        return stub.DeregisterWorker(context, request, &response);
      });
  if (s.ok()) {
    PT_LOG(INFO) << "deregistered " << request.worker_id();
  } else {
    PT_LOG(WARNING) << "could not deregister " << request.worker_id() << ": " << s.error_message()
                    << " (the coordinator will mark it LOST after its lease)";
  }
}

void WorkerAgent::StopRunner() {
  AnnotatedMutexLock change(&runner_change_mu_);
  StopRunnerLocked();
}

void WorkerAgent::StopRunnerLocked() {
  std::unique_ptr<JobRunner> runner;
  {
    AnnotatedMutexLock lock(&mu_);
    runner = std::move(runner_);
    if (runner) stopping_job_ = runner->assignment().job_id();
  }
  if (runner) {
    runner->Stop();
    data_plane_->ClearJob();
    AnnotatedMutexLock lock(&mu_);
    stopping_job_.clear();
  }
}

void WorkerAgent::HeartbeatLoop() {
  // Whether the beat before was sent at once after a refusal that named
  // the leader: one such resend in a row, as two followers with stale
  // hints could name each other.
  bool resent_at_once = false;
  FailureStretch failures(options_.clock);
  while (true) {
    v1::HeartbeatRequest request;
    absl::Duration interval;
    absl::Duration deadline;
    {
      AnnotatedMutexLock lock(&mu_);
      request.set_worker_id(worker_id_);
      request.set_incarnation(incarnation_);
      interval = heartbeat_interval_;
      deadline = HeartbeatDeadline(options_.rpc_timeout, lease_, heartbeat_interval_);
    }
    // Read together: the coordinator takes "idle" as having stopped a job
    // only when the same heartbeat names it.
    auto [instruction, last_job] = InstructionAndLastJob();
    request.set_current_instruction(std::move(instruction));
    request.set_last_job_id(std::move(last_job));
    request.set_nccl_unique_id(GroupIdToReport());
    grpc::ClientContext context;
    // A beat answered too late for the lease is given up (DEADLINE_EXCEEDED,
    // a failed beat like any other: the next goes an interval later).
    SetDeadline(&context, deadline);
    AddBearer(context, session_->Get());
    v1::HeartbeatResponse response;
    const CoordinatorStub coordinator = Stub();
    // Leave() cancels a heartbeat in flight: with a black-holed coordinator
    // it would hold the shutdown for its whole deadline (rpc_timeout),
    // inside the stop bound, and the worker would exit without deregistering.
    grpc::Status s;
    {
      const CallCancel::Scope cancellable(&heartbeat_cancel_, [&context] { context.TryCancel(); });
      if (!cancellable.active()) return;  // leaving
      s = coordinator.stub->Heartbeat(&context, request, &response);
    }
    // Cut off by Leave: not the coordinator's failure.
    if (!s.ok() && heartbeat_cancel_.cancelled()) return;
    CountFailure(options_.metrics, WorkerMetrics::CoordinatorCall::kHeartbeat, s);
    // A follower's refusal naming the leader (the first beat after a
    // failover, or the beat after one that timed out at the leader and
    // moved on to the next address): sent again at once. An interval later,
    // the leader went unheard for two or three intervals of its lease.
    bool followed_leader = !s.ok() && endpoints_->Failed(s, context, coordinator.channel);
    // Or another call (the assignment stream's) moved on first, while this
    // beat was in flight to the follower: sent at once to where it went.
    if (!s.ok() && !followed_leader && s.error_code() == grpc::StatusCode::UNAVAILABLE &&
        endpoints_->channel() != coordinator.channel) {
      followed_leader = true;
    }
    if (followed_leader && !resent_at_once) {
      // A failed beat all the same: "after N failed heartbeats" says what
      // the metric counted. Its resend's failure, if any, is the one logged.
      failures.Count();
      resent_at_once = true;
      AnnotatedMutexLock lock(&mu_);
      if (stopping_) return;
      continue;
    }
    resent_at_once = false;
    if (s.error_code() == grpc::StatusCode::NOT_FOUND ||
        s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      // The coordinator declared this incarnation gone: its job is lost.
      PT_LOG(WARNING) << "coordinator dropped this worker (" << s.error_message()
                      << "); registering again";
      if (options_.on_registration_change) options_.on_registration_change(false);
      {
        AnnotatedMutexLock lock(&mu_);
        if (stopping_) return;  // Stop() stops the runner, under its bound
      }
      StopRunner();
      const absl::Status registered = RegisterWithRetry(&heartbeat_cancel_, /*first=*/false);
      if (!registered.ok()) {
        if (IsRegistrationRefusal(static_cast<grpc::StatusCode>(registered.code()))) {
          PT_LOG(ERROR) << "the coordinator refused this worker's registration: " << registered
                        << "; no more heartbeats";
          {
            AnnotatedMutexLock lock(&mu_);
            registration_refused_ = registered;  // ends AwaitRegisteredAgain
          }
          if (options_.on_registration_refused) options_.on_registration_refused(registered);
        }
        return;  // refused, or stopped while retrying
      }
      if (options_.on_registration_change) options_.on_registration_change(true);
      // A stream of the old incarnation reopens as the new one. The watch
      // loop may have opened the new one already (the registration woke
      // it): cancelling that would end the stream the coordinator holds
      // for the new incarnation, which it counts as the worker lost.
      AnnotatedMutexLock lock(&mu_);
      if (watch_context_ != nullptr && watch_opened_as_ != registrations_) {
        watch_cancelled_to_reopen_ = true;
        watch_context_->TryCancel();
      }
    } else if (!s.ok()) {
      if (int64_t dropped = 0; failures.Failed(&dropped)) {
        PT_LOG(WARNING) << "heartbeat failed: " << s.error_message()
                        << " (logged once a minute until one is answered)"
                        << LogRateLimiter::Dropped(dropped);
      }
    } else {
      const std::string after = failures.Ended("heartbeats");
      if (!after.empty()) PT_LOG(INFO) << "coordinator reachable again " << after;
      AnnotatedMutexLock lock(&mu_);
      if (!request.nccl_unique_id().empty() && group_id_ == request.nccl_unique_id()) {
        group_id_unreported_ = false;
      }
      if (response.drained() && !drained_) {
        drained_ = true;
        PT_LOG(INFO) << "drained: this worker gets no job until its process restarts";
      }
    }
    // Until the interval ends, or a STOP asks for a heartbeat now.
    {
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || heartbeat_now_; },
          interval);
      if (stopping_) return;
      heartbeat_now_ = false;
    }
  }
}

void WorkerAgent::WatchLoop() {
  Backoff backoff(options_.backoff);
  // A stream ended: logged at once, then one a minute (the heartbeats'
  // warnings say when the coordinator is reachable again). Made anew once
  // a stream delivers or the worker reopens it itself: the first failure
  // of the next outage is logged at once.
  std::optional<LogRateLimiter> ended_log;
  ended_log.emplace(1, absl::Minutes(1), options_.clock);
  while (true) {
    grpc::ClientContext context;
    v1::WatchAssignmentsRequest request;
    int64_t opened_as = 0;  // registrations_ when this stream opened
    {
      AnnotatedMutexLock lock(&mu_);
      if (stopping_) return;
      request.set_worker_id(worker_id_);
      request.set_incarnation(incarnation_);
      watch_context_ = &context;
      watch_cancelled_to_reopen_ = false;
      opened_as = registrations_;
      watch_opened_as_ = opened_as;
    }
    AddBearer(context, session_->Get());
    const CoordinatorStub coordinator = Stub();
    auto reader = coordinator.stub->WatchAssignments(&context, request);
    v1::Assignment assignment;
    bool delivered = false;
    while (reader->Read(&assignment)) {
      backoff.Reset();
      if (!delivered) ended_log.emplace(1, absl::Minutes(1), options_.clock);
      delivered = true;
      Handle(assignment, request.incarnation());
    }
    const grpc::Status s = reader->Finish();
    if (!s.ok()) endpoints_->Failed(s, context, coordinator.channel);
    bool own_reopen = false;
    {
      AnnotatedMutexLock lock(&mu_);
      watch_context_ = nullptr;
      if (stopping_) return;
      own_reopen = watch_cancelled_to_reopen_ && s.error_code() == grpc::StatusCode::CANCELLED;
    }
    // Not this worker's own cancel, to reopen the stream as a new
    // registration (HeartbeatLoop). The coordinator's is counted: it ends
    // a superseded stream, or one open at its shutdown, so too.
    if (!own_reopen) {
      CountFailure(options_.metrics, WorkerMetrics::CoordinatorCall::kAssignmentStream, s);
    }
    const absl::Duration wait = backoff.Next();
    if (int64_t dropped = 0; ended_log->Allow(&dropped)) {
      PT_LOG(WARNING) << "assignment stream ended (" << s.error_message() << "); reopening in "
                      << absl::FormatDuration(wait) << " or once registered again"
                      << LogRateLimiter::Dropped(dropped);
    }
    if (own_reopen) ended_log.emplace(1, absl::Minutes(1), options_.clock);
    // A registration (the heartbeat loop's, after a coordinator restart
    // or a failover) ends the wait: the coordinator has this worker again
    // and its jobs wait for the stream, not for the backoff.
    AnnotatedMutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                 mu_) { return stopping_ || registrations_ != opened_as; },
                             wait)) {
      if (stopping_) return;
      backoff.Reset();
    }
  }
}

void WorkerAgent::Handle(const v1::Assignment& a, int64_t stream_incarnation) {
  // One change of runner at a time (runner_change_mu_): ClearJob only ever
  // clears the job whose runner it stopped.
  AnnotatedMutexLock change(&runner_change_mu_);
  {
    AnnotatedMutexLock lock(&mu_);
    // Leaving (Leave): Stop() stops the runner next, under the caller's
    // bound (--stop-timeout-seconds); stopped here, on the watch thread
    // Leave joins, the stage's stop escaped that bound. Nor does a RUN
    // start anything now.
    if (stopping_) return;
    // Read from the stream of an incarnation the coordinator has since
    // dropped (the heartbeat thread registered again meanwhile): that
    // session is over, and a runner started now would report as the new
    // incarnation (the coordinator takes reports only of the session's).
    if (stream_incarnation != incarnation_) {
      PT_LOG(INFO) << "ignoring the assignment of job " << a.job_id() << " from the stream of "
                   << "incarnation " << stream_incarnation << ", not the current " << incarnation_;
      return;
    }
    if (runner_ && runner_->assignment().job_id() == a.job_id() &&
        runner_->assignment().plan_version() == a.plan_version() &&
        runner_incarnation_ == stream_incarnation && a.action() == v1::Assignment::ACTION_RUN) {
      return;  // already running this plan (a re-sent assignment)
    }
    // The job the drain said this worker is assigned to has spoken: its
    // RUN (the runner's completion counts from now) or its STOP.
    if (a.job_id() == assigned_job_) assigned_job_.clear();
    if (a.action() == v1::Assignment::ACTION_STOP &&
        (!runner_ || runner_->assignment().job_id() != a.job_id())) {
      // Nothing of that job runs here (it ended before this worker took
      // its RUN): idle after it all the same.
      if (!runner_) last_job_id_ = a.job_id();
      return;
    }
    replacing_runner_ = a.action() == v1::Assignment::ACTION_RUN;
  }
  StopRunnerLocked();
  {
    AnnotatedMutexLock lock(&mu_);
    // Leave() began while the old runner stopped: this worker has
    // deregistered, and a job started now would run (data plane, corpus)
    // for a registration that is gone, inside Stop()'s watchdog.
    if (stopping_) {
      replacing_runner_ = false;
      return;
    }
  }
  if (a.action() != v1::Assignment::ACTION_RUN) {
    PT_LOG(INFO) << "stopped job " << a.job_id();
    // A job that stops us may be recovering: it re-plans once it has heard
    // from each of its workers, so say at once that this one is alive.
    AnnotatedMutexLock lock(&mu_);
    last_job_id_ = a.job_id();
    heartbeat_now_ = true;
    return;
  }
  PT_LOG(INFO) << "running job " << a.job_id() << " stage " << a.stage() << "/" << a.num_stages()
               << " of replica " << a.replica() << "/" << std::max(1, a.replicas()) << " units ["
               << a.backward_units().begin() << ", " << a.backward_units().end() << ")";
  // The data plane and the mailbox are sized from the assignment: only
  // once its bounds hold (unchecked, the product below could overflow),
  // and opened only with this worker's data-plane keys (without, it would
  // take frames from anyone). A runner is started either way: it fails at
  // once with the same error and reports it to the coordinator as the
  // job's.
  absl::Status bounded = CheckAssignmentLayout(a);
  if (bounded.ok()) bounded = CheckDataPlaneKeys(a);
  // spec.training.steps as the runner resolves it (ResolveJobSpec keeps it;
  // a spec it refuses fails the runner anyway).
  if (bounded.ok()) bounded = CheckStartIteration(a, a.spec().training().steps());
  if (bounded.ok()) {
    // The mailbox first: once SetJob admits the job's streams their frames
    // are Reserved at once, and until OpenJob the mailbox would refuse them
    // as another job's (FAILED_PRECONDITION), losing a tensor the stage
    // then waits out its receive timeout for. Frames of the job before are
    // refused either way.
    mailbox_->OpenJob(DataPlaneJobId(a), a.start_iteration());
    // Every worker of the job may send here: every replica's stages (the
    // data-parallel all-reduce), every tensor rank (the tensor-parallel
    // ones).
    data_plane_->SetJob(DataPlaneJobId(a), AssignmentWorkerCount(a), a.data_plane_receive_key());
  } else {
    PT_LOG(ERROR) << "job " << a.job_id() << ": " << bounded << "; not opening its data plane";
  }
  JobRunnerOptions runner_options;
  {
    AnnotatedMutexLock lock(&mu_);
    // Either kind of group uses the id up (a device group's, or a replica
    // device group's: coordinator/planner/replica_device_groups.h).
    if (!group_id_.empty() && (a.device_group().nccl_unique_id() == group_id_ ||
                               a.replica_device_group().nccl_unique_id() == group_id_)) {
      group_id_used_ = true;
    }
    runner_options.worker_id = worker_id_;
    // The stream's, not incarnation_, which a registration again may have
    // moved on since the check above: such a runner's reports are refused
    // as a stale runner's, and it stops quietly.
    runner_options.incarnation = stream_incarnation;
    runner_options.report_retry_for = ReportRetryForLease(lease_, heartbeat_interval_);
  }
  runner_options.recv_timeout = options_.recv_timeout;
  runner_options.backend = options_.backend;
  runner_options.on_backend_failure = options_.on_backend_failure;
  // Wakes AwaitDrained, whose condition reads completed(): released, mu_
  // has it re-checked (the runner ends before the agent: StopRunner).
  runner_options.on_completed = [this] { AnnotatedMutexLock wake(&mu_); };
  runner_options.data_roots = options_.data_roots;
  runner_options.checkpoint_root = options_.checkpoint_root;
  runner_options.checkpoint_hold = options_.checkpoint_hold;
  runner_options.memory_limit_bytes = device_.memory_limit_bytes();  // bounds the corpus
  auto runner = std::make_unique<JobRunner>(a, mailbox_, make_transport_, link_.get(),
                                            runner_options, observer_);
  runner->Start();
  AnnotatedMutexLock lock(&mu_);
  runner_ = std::move(runner);
  runner_incarnation_ = stream_incarnation;
  replacing_runner_ = false;
  last_job_id_ = a.job_id();
}

}  // namespace pipetrain
