#include "coordinator/store/leader_election.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "coordinator/store/store.h"
#include "worker/agent/backoff.h"

namespace pipetrain {
namespace {

// The shortest pause between rounds, whatever the TTL.
constexpr absl::Duration kMinTick = absl::Milliseconds(100);

absl::Status CheckOptions(const LeaderElectionOptions& options) {
  absl::Status identity = CheckStoreKey(options.identity);
  if (!identity.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("election identity: ", identity.message()));
  }
  if (options.ttl < absl::Seconds(1) || options.ttl % absl::Seconds(1) != absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("election ttl ",
                                                   absl::FormatDuration(options.ttl),
                                                   " must be a whole number of seconds >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsEtcdRefusal(const absl::Status& status) {
  return absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status) ||
         absl::IsInvalidArgument(status);
}

absl::Duration ElectionRefusalPause(absl::Duration tick, int refusals, uint64_t seed) {
  const int doublings = std::clamp(refusals - 1, 0, 62);
  const double base = absl::ToDoubleSeconds(tick) * std::ldexp(1.0, doublings);
  const double capped = std::min(base, absl::ToDoubleSeconds(kMaxRefusalPause));
  return absl::Seconds(capped *
                       BackoffJitterFactor(seed, static_cast<uint32_t>(refusals), /*jitter=*/0.5));
}

absl::StatusOr<std::unique_ptr<LeaderElection>> LeaderElection::Create(
    EtcdOptions etcd, LeaderElectionOptions options) {
  absl::Status valid = CheckOptions(options);
  if (!valid.ok()) return valid;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(std::move(etcd));
  if (!client.ok()) return client.status();
  return std::unique_ptr<LeaderElection>(
      new LeaderElection(std::move(*client), std::move(options)));
}

LeaderElection::LeaderElection(std::unique_ptr<EtcdClient> client, LeaderElectionOptions options)
    : client_(std::move(client)),
      options_(std::move(options)),
      key_(client_->options().prefix + "leader"),
      clock_(options_.clock != nullptr ? options_.clock : MonotonicClock()),
      refusal_seed_(options_.refusal_seed.value_or(RandomBackoffSeed())) {
  AnnotatedMutexLock lock(&mu_);
  granted_ttl_ = options_.ttl;
}

LeaderElection::~LeaderElection() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status LeaderElection::Start() {
  AnnotatedMutexLock lock(&mu_);
  if (started_ || stopping_) {
    return absl::FailedPreconditionError(absl::StrCat("election ", key_, " for ", options_.identity,
                                                      " was already started, or has resigned"));
  }
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

absl::Status LeaderElection::Resign() {
  PT_CHECK(std::this_thread::get_id() != thread_.get_id()) << "Resign called from on_change";
  {
    AnnotatedMutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  int64_t lease = 0;
  bool was_leader = false;
  {
    AnnotatedMutexLock lock(&mu_);
    std::swap(lease, lease_id_);
    std::swap(was_leader, is_leader_);
    create_revision_ = 0;
    if (was_leader) leader_.clear();
  }
  absl::Status revoked;
  if (lease != 0) {
    etcdserverpb::LeaseRevokeRequest request;
    request.set_id(lease);
    revoked = client_->LeaseRevoke(request);
    if (absl::IsNotFound(revoked)) revoked = absl::OkStatus();  // Expired already.
  }
  if (was_leader) {
    PT_LOG(INFO) << "election " << key_ << ": " << options_.identity << " resigned";
    if (options_.on_change) options_.on_change(false);
  }
  return revoked;
}

absl::Duration ElectionWait(absl::Duration tick, std::optional<absl::Duration> lease_left) {
  if (!lease_left.has_value()) return tick;
  return std::min(tick, std::max(*lease_left, absl::ZeroDuration()));
}

bool LeaderElection::LeadingLocked() const { return is_leader_ && Steady() < lease_expiry_; }

absl::Status LeaderElection::Refusal() const {
  AnnotatedMutexLock lock(&mu_);
  return refusal_;
}

bool LeaderElection::IsLeader() const {
  AnnotatedMutexLock lock(&mu_);
  return LeadingLocked();
}

std::string LeaderElection::Leader() const {
  AnnotatedMutexLock lock(&mu_);
  return leader_;
}

std::optional<LeaderTerm> LeaderElection::CurrentTerm() const {
  AnnotatedMutexLock lock(&mu_);
  if (!LeadingLocked()) return std::nullopt;
  return LeaderTerm{key_, options_.identity, lease_id_, create_revision_};
}

void LeaderElection::Run() {
  for (;;) {
    const absl::Duration pause = RunRound();
    AnnotatedMutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(stopping, pause)) return;
  }
}

absl::Duration LeaderElection::Round() {
  {
    AnnotatedMutexLock lock(&mu_);
    PT_CHECK(!started_) << "election " << key_ << ": Round called after Start";
  }
  return RunRound();
}

absl::Duration LeaderElection::RunRound() {
  const absl::Status failed = Step();
  absl::Duration pause;
  bool first_refusal = false;
  {
    AnnotatedMutexLock lock(&mu_);
    pause = std::max(granted_ttl_ / 5, kMinTick);
    if (failed.ok()) {
      refusals_ = 0;
      refusal_ = absl::OkStatus();
    } else if (IsEtcdRefusal(failed) && !is_leader_) {
      // A leader's refusals keep the tick: its lease bounds its tries, and one
      // may still renew it.
      first_refusal = refusals_ == 0;
      ++refusals_;
      refusal_ = failed;
      pause = ElectionRefusalPause(pause, refusals_, refusal_seed_);
    }
    pause = ElectionWait(
        pause, is_leader_ ? std::optional<absl::Duration>(lease_expiry_ - Steady()) : std::nullopt);
  }
  if (first_refusal) {
    const std::string& prefix = client_->options().prefix;
    PT_LOG(ERROR) << "election " << key_ << ": etcd refuses " << options_.identity << ": " << failed
                  << ". It cannot become leader until that is fixed: check "
                  << "--etcd-user and --etcd-password-file (or --etcd-cert's common name), and "
                  << "that the etcd user's role has readwrite on the prefix (etcdctl role "
                  << "grant-permission ROLE readwrite --prefix " << prefix << "). It keeps "
                  << "retrying, less often each time (up to every "
                  << absl::FormatDuration(kMaxRefusalPause) << "), and does not exit";
  }
  return pause;
}

absl::Status LeaderElection::Step() {
  round_failure_ = absl::OkStatus();
  if (EnsureLease() && RenewIfDue()) Observe();
  return round_failure_;
}

void LeaderElection::Failed(const char* what, const absl::Status& status) {
  if (round_failure_.ok()) round_failure_ = status;
  if (int64_t dropped = 0; failures_log_.Allow(&dropped)) {
    PT_LOG(WARNING) << "election " << key_ << ": " << what << ": " << status
                    << LogRateLimiter::Dropped(dropped);
  }
}

absl::Time LeaderElection::Steady() const { return clock_->Now(); }

absl::Time LeaderElection::WallDeadlineLocked() const {
  return absl::Now() + (lease_expiry_ - Steady());
}

bool LeaderElection::LeaseGoneLocked() {
  if (lease_id_ != 0 && Steady() >= lease_expiry_) {
    // A follower holds no key under its lease, and one that etcd refuses
    // pauses past the TTL on purpose: a line per round of that would be
    // noise outside failures_log_. A leader's lapse ends its term; it is
    // logged once, before the step-down.
    if (is_leader_) {
      PT_LOG(WARNING) << "election " << key_ << ": lease " << lease_id_ << " of "
                      << options_.identity << " was not renewed within "
                      << absl::FormatDuration(granted_ttl_) << "; counting it as expired";
    }
    lease_id_ = 0;
  }
  return lease_id_ == 0;
}

absl::Time LeaderElection::RpcDeadline() const {
  AnnotatedMutexLock lock(&mu_);
  return lease_id_ != 0 ? WallDeadlineLocked() : absl::InfiniteFuture();
}

// Grants a lease when there is none (first round, or the last one expired).
bool LeaderElection::EnsureLease() {
  bool was_leader = false;
  {
    AnnotatedMutexLock lock(&mu_);
    if (!LeaseGoneLocked()) return true;
    was_leader = is_leader_;
  }
  // is_leader_, not IsLeader(): the latter is false already once the lease
  // has run out by the clock, and the step-down (on_change(false): the
  // coordinator exits) must still happen.
  if (was_leader) BecomeFollower("", "its lease expired");
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(absl::ToInt64Seconds(options_.ttl));
  etcdserverpb::LeaseGrantResponse response;
  const absl::Time sent = Steady();
  absl::Status status = client_->LeaseGrant(request, &response);
  if (status.ok() && (!response.error().empty() || response.ttl() <= 0)) {
    status = absl::UnavailableError(absl::StrCat("LeaseGrant answered TTL ", response.ttl(),
                                                 " and error \"", response.error(), "\""));
  }
  if (!status.ok()) {
    Failed("cannot get a lease", status);
    return false;
  }
  AnnotatedMutexLock lock(&mu_);
  lease_id_ = response.id();
  granted_ttl_ = absl::Seconds(response.ttl());
  last_renewal_ = sent;
  lease_expiry_ = sent + granted_ttl_;
  return true;
}

// Renews the lease when ttl/3 has passed since the last renewal. False when
// the lease is gone (etcd says so, or it expired here).
bool LeaderElection::RenewIfDue() {
  etcdserverpb::LeaseKeepAliveRequest request;
  absl::Time deadline;
  {
    AnnotatedMutexLock lock(&mu_);
    if (Steady() < last_renewal_ + granted_ttl_ / 3) return true;
    request.set_id(lease_id_);
    deadline = WallDeadlineLocked();
  }
  etcdserverpb::LeaseKeepAliveResponse response;
  const absl::Time sent = Steady();
  absl::Status status = client_->LeaseKeepAliveOnce(request, &response, deadline);
  bool gone = false;
  bool was_leader = false;
  {
    AnnotatedMutexLock lock(&mu_);
    was_leader = is_leader_;
    if (status.ok() && response.ttl() > 0) {
      last_renewal_ = sent;
      lease_expiry_ = sent + absl::Seconds(response.ttl());
    } else if (status.ok()) {
      lease_id_ = 0;  // etcd no longer knows it: expired or revoked.
    }
    gone = LeaseGoneLocked();
  }
  if (!status.ok()) Failed("cannot renew lease", status);
  if (gone && was_leader) BecomeFollower("", "its lease is gone");  // see EnsureLease
  return !gone;
}

// Reads the leader key; campaigns when it is free.
void LeaderElection::Observe() {
  etcdserverpb::RangeRequest request;
  request.set_key(key_);
  etcdserverpb::RangeResponse response;
  absl::Status status = client_->Range(request, &response, RpcDeadline());
  if (!status.ok()) {
    Failed("cannot read the leader key", status);
    return;
  }
  if (response.kvs_size() == 0) {
    BecomeFollower("", "the leader key disappeared");
    Campaign();
    return;
  }
  int64_t lease = 0;
  {
    AnnotatedMutexLock lock(&mu_);
    lease = lease_id_;
  }
  JudgeLeaderKey(response.kvs(0), lease, "another participant holds the leader key");
}

void LeaderElection::JudgeLeaderKey(const mvccpb::KeyValue& kv, int64_t lease,
                                    const std::string& why) {
  if (lease != 0 && kv.lease() == lease) {
    BecomeLeader(kv.create_revision());
  } else {
    BecomeFollower(kv.value(), why);
  }
}

// Creates the leader key if it is still absent, in one Txn.
void LeaderElection::Campaign() {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key_);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key_);
  put->set_value(options_.identity);
  {
    AnnotatedMutexLock lock(&mu_);
    put->set_lease(lease_id_);
  }
  txn.add_failure()->mutable_request_range()->set_key(key_);
  etcdserverpb::TxnResponse response;
  absl::Status status = client_->Txn(txn, &response, RpcDeadline());
  if (status.code() == absl::StatusCode::kNotFound) {
    // etcd no longer knows the lease (it expired there first, or was
    // revoked): a campaign with it can never succeed, so the next round
    // grants a new one instead of failing every tick until it would expire
    // here.
    AnnotatedMutexLock lock(&mu_);
    lease_id_ = 0;
  }
  if (!status.ok()) {
    Failed("campaign failed", status);
    return;
  }
  if (response.succeeded()) {
    // The Txn's revision is the one that created the key.
    BecomeLeader(response.header().revision());
    return;
  }
  // The key as etcd holds it. Under the lease campaigned with: this
  // participant's own, written by an earlier try of this Txn whose answer
  // was lost (EtcdClient retried it at the next member); leading now, not
  // following itself until the next round's Observe.
  if (response.responses_size() > 0 && response.responses(0).response_range().kvs_size() > 0) {
    JudgeLeaderKey(response.responses(0).response_range().kvs(0), put->lease(),
                   "another participant won the campaign");
  } else {
    BecomeFollower("", "another participant won the campaign");
  }
}

void LeaderElection::BecomeLeader(int64_t create_revision) {
  {
    AnnotatedMutexLock lock(&mu_);
    const bool changed = !is_leader_;
    is_leader_ = true;
    leader_ = options_.identity;
    create_revision_ = create_revision;
    if (!changed) return;
  }
  PT_LOG(INFO) << "election " << key_ << ": " << options_.identity << " became leader (revision "
               << create_revision << ")";
  if (options_.on_change) options_.on_change(true);
}

std::string LeaderIdentityOf(const std::string& value) {
  return CheckStoreKey(value).ok() ? value : std::string();
}

void LeaderElection::BecomeFollower(const std::string& read_leader, const std::string& why) {
  // The value is etcd's, which anyone with write access there may have set:
  // a leader is named in every refusal's trailing metadata (where gRPC
  // aborts on a byte outside printable ASCII) and in logs, so only an
  // identity that passes the rule written ones do (CheckStoreKey: printable
  // ASCII, bounded) is taken; any other reads as no leader.
  const std::string leader = LeaderIdentityOf(read_leader);
  if (leader.empty() && !read_leader.empty()) {
    PT_LOG(WARNING) << "election " << key_ << ": the leader key holds \""
                    << absl::CHexEscape(read_leader.substr(0, 64)) << "\""
                    << (read_leader.size() > 64 ? "..." : "") << " (" << read_leader.size()
                    << " bytes), not a coordinator identity; treated as no leader";
  }
  {
    AnnotatedMutexLock lock(&mu_);
    const bool changed = is_leader_;
    is_leader_ = false;
    leader_ = leader;
    create_revision_ = 0;
    if (!changed) return;
  }
  PT_LOG(WARNING) << "election " << key_ << ": " << options_.identity
                  << " lost leadership: " << why;
  if (options_.on_change) options_.on_change(false);
}

}  // namespace pipetrain
