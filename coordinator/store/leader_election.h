// LeaderElection: one leader among the coordinators that share an etcd
// prefix (highly available coordinators; see EtcdStore).
//
// Each participant holds an etcd lease of `ttl` and renews it from a thread
// of its own every ttl/3 (LeaseKeepAlive), except a follower that etcd
// refuses (see Refusals): its pauses grow past ttl, so its lease lapses
// between rounds and the next round takes a new one. The leader is whoever
// owns the key "<prefix>leader": campaigning is one Txn that creates the key
// only if it is absent (create_revision == 0), with the participant's
// identity as value and its lease attached, so etcd deletes the key when the
// lease is revoked or expires. Every participant reads the key every ttl/5;
// followers campaign as soon as it is gone.
//
//    Start()
//       │
//       ▼          key absent, and our Txn created it
//   FOLLOWER ────────────────────────────────────────▶ LEADER
//       ▲   ◀──────────────────────────────────────    │
//       │     lease not renewed within ttl, revoked,    │
//       │     or the key gone or held by another        │
//       │                                               │
//       └──── Resign(), destruction ──▶ STOPPED ◀───────┘
//
// Stepping down: the lease counts as expired ttl after the send time of the
// last renewal that etcd answered. etcd's clock for the same lease starts
// later (when the request arrives), so this side steps down first: at that
// point IsLeader and CurrentTerm turn false, and the thread, which a leader
// wakes for it (ElectionWait), runs on_change(false) (the coordinator then
// exits), not a tick (ttl/5) later; sooner when an RPC fails. Renewals and
// reads that would end after that point are cut off at it.
//
// Refusals: etcd answering UNAUTHENTICATED (a wrong --etcd-password-file,
// or a certificate etcd does not map to a user), PERMISSION_DENIED (a user
// without read and write on the prefix) or INVALID_ARGUMENT will answer the
// next round the same, so a follower whose round ended in one waits longer
// each time: ElectionRefusalPause, from the tick up to kMaxRefusalPause.
// Otherwise every round sent etcd a login (a bcrypt check on its CPU) and
// logged a line every tick, forever. The first refusal of a run of them
// logs an ERROR naming what to check, and Refusal() returns the latest; a
// round that succeeds ends the run (the tick again). The election never
// gives up: etcd restarting, or a credential being rotated, refuses for a
// while and then accepts, and the follower then campaigns again within
// kMaxRefusalPause. Its lease lapsing in such a pause is expected and not
// logged (it holds no key under it); only a leader's lapse is. Other
// failures (UNAVAILABLE: etcd down, no quorum) wait the tick, as does a
// leader (its lease bounds its tries, and a retry may still renew it).
// Failed calls are logged at most kElectionFailureLogBurst times a minute
// (LogRateLimiter), with a count of those left out.
//
// IsLeader is advisory: etcd may have revoked the lease, or another
// participant deleted the key, since the last read. The fence is EtcdStore's:
// each of its Commits is a Txn that requires the leader key to still have
// the create_revision of this term (CurrentTerm), so a deposed leader's
// writes fail even before it notices.
//
// Thread-safety: IsLeader, Leader, CurrentTerm and Refusal may be called from
// any thread. Start, Round, Resign and the destructor are for the owner, one
// at a time.
#ifndef PIPETRAIN_COORDINATOR_STORE_LEADER_ELECTION_H_
#define PIPETRAIN_COORDINATOR_STORE_LEADER_ELECTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/log_rate_limiter.h"
#include "coordinator/store/etcd_client.h"

namespace pipetrain {

// How long the election's thread waits before its next round: `tick`, or
// less for a leader whose lease has `lease_left` (none for a follower) and
// runs out before the tick, so that it steps down as the lease ends (at
// once when it has: a negative `lease_left` is 0).
absl::Duration ElectionWait(absl::Duration tick, std::optional<absl::Duration> lease_left);

// The longest pause between a follower's rounds while etcd refuses it.
inline constexpr absl::Duration kMaxRefusalPause = absl::Seconds(30);
// How many failed etcd calls the election logs per minute (the rest are
// counted in the next line that is logged).
inline constexpr int kElectionFailureLogBurst = 5;

// Whether etcd refused the election for a reason that the same call would
// meet again (see the file comment): UNAUTHENTICATED, PERMISSION_DENIED or
// INVALID_ARGUMENT.
bool IsEtcdRefusal(const absl::Status& status);

// The pause after the `refusals`-th refusal in a row (>= 1): tick *
// 2^(refusals - 1), at most kMaxRefusalPause, times a factor in (0.5, 1]
// drawn from (seed, refusals), so that coordinators refused together (etcd
// restarted) do not log in again in lockstep. Deterministic for a seed.
absl::Duration ElectionRefusalPause(absl::Duration tick, int refusals, uint64_t seed);

// One leader's tenure: the leader key as this participant created it.
struct LeaderTerm {
  std::string key;       // "<prefix>leader"
  std::string identity;  // the leader's identity (the key's value)
  int64_t lease_id = 0;
  // The etcd revision that created the key; unique to this term.
  int64_t create_revision = 0;
};

// What EtcdStore needs from an election. LeaderElection implements it; tests
// may fake it.
class LeadershipView {
 public:
  virtual ~LeadershipView() = default;
  // The term this participant leads now, or nullopt when it is not leader.
  virtual std::optional<LeaderTerm> CurrentTerm() const = 0;
  // The current leader's identity as last read; "" when there is none.
  virtual std::string Leader() const = 0;
};

struct LeaderElectionOptions {
  // This coordinator's advertised gRPC address ("10.0.0.5:7070"): what the
  // leader key holds, and what followers name in their errors. Printable
  // ASCII, at most kMaxKeyBytes.
  std::string identity;
  // The lease's time to live, whole seconds. A crashed leader is replaced
  // within ttl (its last renewal was at most ttl/3 earlier) plus etcd's
  // expiry check (0.5 s) plus a follower's tick (ttl/5). etcd raises a TTL
  // below its minimum (2 s with its default election timeout); the granted
  // one is used.
  absl::Duration ttl = absl::Seconds(5);
  // Called with true on becoming leader and false on losing leadership
  // (including at Resign), on the election's thread, never with a lock
  // held. It must return promptly and must not call Resign.
  std::function<void(bool is_leader)> on_change;
  // The seed of ElectionRefusalPause's factor; unset: one drawn at Create,
  // different per process. Tests that check exact pauses set it.
  std::optional<uint64_t> refusal_seed;
  // The monotonic clock the lease is timed on (not owned); nullptr:
  // MonotonicClock(). Tests step a FakeClock past the lease's expiry; the
  // pause between Start's rounds still waits in real time.
  Clock* clock = nullptr;
};

class LeaderElection final : public LeadershipView {
 public:
  // The key is etcd.prefix + "leader". Does not contact etcd.
  // INVALID_ARGUMENT for bad options (the message names the field).
  static absl::StatusOr<std::unique_ptr<LeaderElection>> Create(EtcdOptions etcd,
                                                                LeaderElectionOptions options);

  // Stops the thread (waiting for the RPC in flight, which has a deadline:
  // rpc_timeout per endpoint tried). Does not
  // revoke the lease, and does not call on_change: a successor takes over
  // once the lease expires, as after a crash. Call Resign to hand over now.
  ~LeaderElection() override;
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Starts campaigning on a thread of its own; returns at once.
  // FAILED_PRECONDITION when already started or resigned.
  absl::Status Start();

  // Stops campaigning for good and revokes the lease, which deletes the
  // leader key if this participant held it, so a follower takes over at its
  // next read. Calls on_change(false) if this was leader. Idempotent.
  // Errors: UNAVAILABLE (or another EtcdClient error) when the revoke did not
  // reach etcd; the lease then expires within ttl anyway. Not from on_change.
  absl::Status Resign();

  // One round (lease, renewal, read of the key, campaign) on the caller's
  // thread; returns the pause before the next one (the tick, a refusal's
  // pause, or less for a leader whose lease ends sooner: ElectionWait).
  // Start's thread runs these; tests call it instead of Start, to step
  // rounds without waiting. Requires: not started.
  absl::Duration Round();

  // OK, or etcd's latest refusal (IsEtcdRefusal) of a follower's round
  // while they go on: the election then retries only every
  // ElectionRefusalPause. OK again once a round succeeds.
  absl::Status Refusal() const;

  bool IsLeader() const;
  std::string Leader() const override;
  std::optional<LeaderTerm> CurrentTerm() const override;
  const std::string& key() const { return key_; }

 private:
  LeaderElection(std::unique_ptr<EtcdClient> client, LeaderElectionOptions options);

  void Run();
  // Round, without the check that the thread is not running it.
  absl::Duration RunRound();
  // One round: lease, renewal, read the key, campaign if it is free. Its
  // first failed call's status, OK when none failed.
  absl::Status Step();
  // Logs a failed etcd call (rate-limited) and keeps the round's first
  // failure for Step.
  void Failed(const char* what, const absl::Status& status);
  bool EnsureLease();
  bool RenewIfDue();
  void Observe();
  void Campaign();
  // The leader key as read: ours when it is under `lease` (nonzero: won
  // earlier, or a campaign whose answer was lost after etcd applied it,
  // which a retry then finds taken), else another's.
  void JudgeLeaderKey(const mvccpb::KeyValue& kv, int64_t lease, const std::string& why);
  // Drops the lease if it is past its expiry; true if there is none. Logs
  // the drop only for a leader (see the file comment on refusals).
  bool LeaseGoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // is_leader_, and the lease not past its expiry (the thread may not have
  // noticed yet).
  bool LeadingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the state and, when leadership changed, logs and calls on_change.
  void BecomeLeader(int64_t create_revision);
  void BecomeFollower(const std::string& leader, const std::string& why);
  // The deadline for an RPC made while holding the lease.
  absl::Time RpcDeadline() const;
  // The monotonic clock the lease is timed on (options.clock; an absl::Time
  // only for its arithmetic), and the lease's expiry as a wall-clock RPC
  // deadline.
  absl::Time Steady() const;
  absl::Time WallDeadlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<EtcdClient> client_;
  const LeaderElectionOptions options_;
  const std::string key_;
  Clock* const clock_;

  mutable AnnotatedMutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool is_leader_ ABSL_GUARDED_BY(mu_) = false;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none
  absl::Duration granted_ttl_ ABSL_GUARDED_BY(mu_);
  // On the monotonic clock (Steady): a wall-clock step (NTP) must neither
  // expire the lease early (a needless failover) nor hold renewals back.
  absl::Time lease_expiry_ ABSL_GUARDED_BY(mu_);
  absl::Time last_renewal_ ABSL_GUARDED_BY(mu_);  // send time of the last answered one
  int64_t create_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // Refusals in a row, and the latest (Refusal); 0 and OK after a round
  // that succeeded.
  int refusals_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);

  // Touched only by the thread running rounds (Start's, or Round's caller).
  absl::Status round_failure_;
  const uint64_t refusal_seed_;
  LogRateLimiter failures_log_{kElectionFailureLogBurst, absl::Minutes(1)};

  // Touched only by Start, Resign and the destructor (see above).
  std::thread thread_;
};

// The leader key's value as a leader's identity: `value` when it passes
// the rule identities are written under (CheckStoreKey: printable ASCII, at
// most 512 bytes), else "" (no leader). The key is etcd's, which others
// with write access may set; the identity goes into every follower's
// refusals (gRPC trailing metadata, which must be printable) and logs.
std::string LeaderIdentityOf(const std::string& value);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_LEADER_ELECTION_H_
