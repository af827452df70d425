// Worker membership for the coordinator (DESIGN.md §7): who is registered,
// under which incarnation, in which state, and whose lease has run out.
// Transport-free: it speaks protos and absl::Status; the gRPC and REST
// services only translate.
//
// Worker states (v1::WorkerState):
//
//    Register                   Assign
//       |             +-------+ -------> +----------+
//       v        +--->| READY |          | ASSIGNED |
//   +---------+  |    +-------+ <------- +----------+
//   | JOINING |--+        |      Release       |
//   +---------+  end of   |                    |
//       |       Register  |                    |
//       +-----------------+--------------------+
//       |                                      |
//       | lease expired (CheckLeases),         | Deregister
//       | or stream closed (MarkLost)          |
//       v                                      v
//   +------+             Deregister        +------+
//   | LOST | ----------------------------> | LEFT |
//   +------+                               +------+
//
// - Register from any state (a worker with the same data_address that comes
//   back after a restart, a loss or Deregister) keeps the worker's id, starts
//   a new, larger incarnation and goes to JOINING again.
// - JOINING: a new incarnation while its registration is saved (off the
//   lock, see Options::persist); Register moves it on to READY (or LOST,
//   unsaved) before it returns, so its worker never observes JOINING,
//   though a listing meanwhile may.
// - A worker leaves a job (loss listener fires) when, while ASSIGNED, it is
//   marked LOST, it deregisters, or a new incarnation supersedes it.
//
// Leases: a READY or ASSIGNED worker is LOST once strictly more than `lease`
// has passed since its last heartbeat or the end of its registration
// (JOINING has none: it cannot heartbeat before Register returns). At exactly
// `lease` it is still live, so a heartbeat that arrives on the deadline counts.
//
// Session credentials (coordinator.proto RegisterWorkerResponse.
// session_token): each incarnation gets a fresh random secret; the token is
// "<worker id>.<incarnation>.<secret>", so the coordinator can tell which
// worker a presented credential claims to be and compare only that
// worker's secret (in constant time). A credential is valid exactly while
// its incarnation is the worker's current one.
//
// Capacity: at most Options::max_workers entries. A registration from a new
// data_address when the registry is full evicts the LEFT or LOST entry seen
// longest ago (Options::forget drops its saved copy), except a restored one
// not heard from within a lease of the restore (it may be alive, about to
// register again: evicted, it would lose its id and drain); with none to
// evict it is RESOURCE_EXHAUSTED, which workers retry. Restore keeps the
// max_workers restorable records saved last (a record keeps the heartbeat
// it had when saved: at registration, drain or deregistration; heartbeats
// are not saved) and forgets the others; a restored LEFT entry was last
// seen at its stored heartbeat, the others at the restore: a loss is not
// saved, so a worker lost long before the coordinator stopped is restored
// as one that was live then.
//
// NCCL unique ids (coordinator.proto DeviceInfo.nccl_unique_id): the
// registry keeps each worker's current id apart from its v1::Worker, so List
// and Get (which feed ListWorkers and REST /v1/workers) never carry it; the
// id lets whoever holds it join that worker's NCCL bootstrap. Register sets
// it (empty: the worker cannot join device groups), a heartbeat with a
// non-empty id replaces it, and ConsumeNcclUniqueId clears it once a job
// hands it to a device group, so it is never handed out twice: the last
// consumed id, should the worker offer it again (a heartbeat repeated after
// a lost response, or a re-registration before the assignment that used it
// arrived), is ignored, across incarnations too.
//
// Thread-safety: every method is thread-safe. The loss listener runs outside
// the registry's lock and may call back into the registry.
#ifndef PIPETRAIN_COORDINATOR_REGISTRY_WORKER_REGISTRY_H_
#define PIPETRAIN_COORDINATOR_REGISTRY_WORKER_REGISTRY_H_

#include <array>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/serial_executor.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// The number of a worker id "w-<n>" (ids are listed in its order), or
// nullopt when `id` is not of that form. SimpleAtoi's leniency stays: "w-01"
// parses as 1 (FindLocked then compares the whole id).
std::optional<int64_t> WorkerIdNumber(absl::string_view id);

class WorkerRegistry {
 public:
  struct Options {
    // Workers must present exactly this token to Register. Empty: registration
    // is open to anyone who reaches the coordinator (local use only).
    std::string join_token;
    // How often workers heartbeat; Register tells them. The staleness loop
    // checks leases every heartbeat_interval / 2 of real time.
    absl::Duration heartbeat_interval = absl::Seconds(1);
    // A live worker silent for longer than this is LOST.
    absl::Duration lease = absl::Seconds(5);
    // Time source for the timestamps shown (last_heartbeat) and the order
    // of eviction; nullptr means RealClock(). Not owned; must outlive the
    // registry.
    Clock* clock = nullptr;
    // Judges the leases (only differences of its readings count): the
    // coordinator gives MonotonicClock(), so that a step of the wall clock
    // (NTP, a resumed laptop) neither marks every worker LOST at once nor
    // hides a dead one. nullptr: `clock` (a test's FakeClock moves both).
    Clock* lease_clock = nullptr;
    // Most entries kept (every state); see "Capacity" above. >= 1.
    int max_workers = 4096;
    // Durable state (coordinator/store/coordinator_state.h): called with a
    // copy of the worker whenever a registration creates a worker or an
    // incarnation, a worker is drained, and when it deregisters (LEFT);
    // Register fails (UNAVAILABLE, nothing acknowledged) when it does, while
    // Deregister only logs it. Empty: nothing is kept.
    // persist and forget run on the registry's own store thread, in the
    // order of the changes they save, never under the registry's lock: a
    // slow store (an etcd election) must not hold up heartbeats, or every
    // worker's lease would run out behind it.
    std::function<absl::Status(const v1::Worker&)> persist;
    // Called with a worker's id when the registry drops its record:
    // evicted for a new one (see "Capacity"), or one of more than
    // max_workers records given to Restore. The durable copy goes too, so
    // the store holds no more than the registry (pods come back with new
    // addresses). Empty: nothing to drop.
    std::function<void(const std::string& worker_id)> forget;
    // Set: Register refuses (FAILED_PRECONDITION naming both builds, before
    // anything is stored) a worker whose RegisterWorkerRequest.build is not
    // this build (SameBuild, common/build_identity.h). The coordinator sets
    // its own unless started with --allow-mixed-builds. Unset: any build,
    // as reported, is recorded in Worker.build.
    std::optional<v1::BuildIdentity> required_build;
    // Whether workers' data planes use TLS (the coordinator's
    // --worker-tls-ca given): Register refuses (FAILED_PRECONDITION, before
    // anything is stored) a worker whose RegisterWorkerRequest.data_plane_tls
    // differs, naming the flags that would make them agree.
    bool data_plane_tls = false;
  };

  // Who a session credential belongs to.
  struct SessionIdentity {
    std::string worker_id;
    int64_t incarnation = 0;
  };

  // Called once per worker that drops out of a job: its id, the job, a
  // reason naming the worker and what to check, and the incarnation that
  // dropped out (when a worker registers again it is the one superseded,
  // no longer the registry's current one). Runs on the thread whose call
  // caused the loss (CheckLeases / the staleness loop, Register,
  // Deregister), outside the registry's lock; calls may be concurrent.
  using LossListener = std::function<void(const std::string& worker_id, const std::string& job_id,
                                          const std::string& reason, int64_t incarnation)>;

  // OK, or INVALID_ARGUMENT naming the option: heartbeat_interval must be
  // positive and finite, lease must be finite and longer than
  // heartbeat_interval (else on-time workers would be declared lost).
  static absl::Status ValidateOptions(const Options& options);

  // Requires ValidateOptions(options).ok() (checked: aborts otherwise; flag
  // parsing should call ValidateOptions first to report a Status).
  explicit WorkerRegistry(Options options);
  // Stops the staleness loop if it runs.
  ~WorkerRegistry();
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Admits a worker. The first registration of a data_address gets the next
  // id ("w-1", "w-2", ...) and incarnation 1; a later one with the same
  // data_address keeps the id, gets incarnation + 1 and replaces the device
  // facts and addresses. The new incarnation is JOINING (placed nowhere)
  // while it is saved, then READY, with a fresh lease,
  // and Worker.drained as the request says (a drained process registering
  // again; the job manager gives it no job). If
  // the superseded incarnation was ASSIGNED, the loss listener fires for its
  // job before Register returns.
  // The response carries the new incarnation's session credential.
  // A retry (the same non-empty registration_id) of the registration that
  // made the current incarnation, while that one is READY or ASSIGNED, has
  // not heartbeated yet, and the retry asks for no drain it lacks, gets the
  // same answer (its lease renewed), not a new incarnation. After its first
  // heartbeat the answer provably arrived: the id (a secret, compared in
  // constant time) is retired, and the same request makes a new incarnation.
  // Possible errors:
  //   UNAUTHENTICATED: join token missing or wrong (checked first).
  //   INVALID_ARGUMENT: data_address is empty, or a field exceeds its bound
  //     (registration_limits.h), naming the field.
  //   RESOURCE_EXHAUSTED: a new data_address while max_workers entries are
  //     live, or LOST and restored within a lease (none to evict; retry).
  //   FAILED_PRECONDITION: another build than options.required_build, or
  //     data-plane TLS other than options.data_plane_tls (not to retry).
  //   UNAVAILABLE: the registration could not be saved (retry).
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest& request);

  // UNAUTHENTICATED when `join_token` is not the registry's (always OK when
  // the registry has none). Register checks it first; the gRPC service
  // calls it ahead of handling, so a refused registration counts as refused.
  absl::Status CheckJoinToken(absl::string_view join_token) const;

  // The worker and incarnation a session credential (RegisterWorkerResponse.
  // session_token) belongs to, if it is the current incarnation's.
  // Possible errors: UNAUTHENTICATED when it is malformed, names an unknown
  // worker, or is not the current incarnation's (the message says to
  // register again; it never says which part was wrong).
  absl::StatusOr<SessionIdentity> AuthenticateSession(absl::string_view token) const;
  // Whether a token AuthenticateSession refuses is a worker's own session
  // gone stale, for metrics only (the caller is refused all the same): the
  // incarnation before a known worker's current one, with that
  // incarnation's secret; or, within one lease of a coordinator restart
  // (which gives every restored worker a new secret, the old ones unknown),
  // the current incarnation of a restored worker not heard from since. A
  // restart has every worker's next calls refused once: counted apart from
  // strangers' (pipetrain_rpc_stale_sessions_total).
  bool IsStaleSession(absl::string_view token) const;
  // The current incarnation's session credential, for the coordinator's own
  // calls to the worker (WorkerControl). NOT_FOUND for an unknown id.
  absl::StatusOr<std::string> SessionToken(const std::string& worker_id) const;

  // Takes back the workers a previous coordinator registered (the durable
  // state): their ids, data addresses, latest incarnations and device
  // facts. They are LOST until they register again, which keeps their ids
  // (a new incarnation), except those saved as they deregistered, which
  // stay LEFT with their last heartbeat; new addresses get ids after the
  // largest restored.
  // Call before serving. Entries whose id is not "w-<n>" with n in [1,
  // kMaxRestoredWorkerNumber], or whose incarnation is outside [0,
  // kMaxRestoredWorkerNumber], are skipped: the next id and the next
  // incarnation add one to them. Of records sharing a data address the one
  // saved last is restored and the others forgotten (an eviction whose
  // delete failed). Skipped and forgotten records take none of the room.
  void Restore(const std::vector<v1::Worker>& workers);
  static constexpr int64_t kMaxRestoredWorkerNumber = int64_t{1} << 53;

  // Renews the lease of a live worker and stores its current_instruction,
  // and its nccl_unique_id when non-empty and not the one last consumed.
  // Retires the incarnation's registration_id (see Register).
  // Possible errors:
  //   INVALID_ARGUMENT: worker_id empty, incarnation not positive, or
  //     current_instruction / nccl_unique_id over their bounds.
  //   NOT_FOUND: no worker has this id (evicted, or never registered);
  //     register again. Over gRPC a worker never sees it: the session check
  //     before Heartbeat (AuthenticateSession) refuses an unknown worker, and
  //     every worker after a coordinator restart, with UNAUTHENTICATED.
  //   FAILED_PRECONDITION: the incarnation is not the current one
  //     ("incarnation 2 superseded by 3; re-register"), or the worker is LOST
  //     or LEFT; in every case the worker must register again.
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);

  // Records that incarnation `incarnation` of the worker is drained
  // (JobManager::Drain): Worker.drained is set, and persisted (Options::
  // persist), so that after a coordinator restart the same process
  // registering again (RegisterWorkerRequest.previous_incarnation) is
  // drained even if it had not heard of it. Idempotent.
  // FAILED_PRECONDITION when that incarnation is not the current one;
  // UNAVAILABLE with persist's message when the save failed (the flag stays
  // set here).
  absl::Status MarkDrained(const std::string& worker_id, int64_t incarnation);
  // Whether `worker_id` is LOST only because this coordinator restored it
  // (Restore) and has not heard from it since: its process may still be
  // alive and register again as the same process (previous_incarnation),
  // which keeps a drain marked on the restored incarnation.
  bool RestoredUnheard(const std::string& worker_id) const;

  // The coordinator knows incarnation `incarnation` of the worker is gone
  // before its lease runs out (its assignment stream closed): if it is
  // still the current incarnation and live, it becomes LOST with `why` in
  // the reason, and the loss listener fires when it was ASSIGNED. A later
  // Heartbeat of that incarnation fails, so a worker that was not gone
  // registers again. Otherwise nothing happens.
  void MarkLost(const std::string& worker_id, int64_t incarnation, const std::string& why);

  // Marks the worker LEFT (graceful shutdown). Idempotent: deregistering a
  // LEFT worker again is OK. If it was ASSIGNED, the loss listener fires.
  // Possible errors: NOT_FOUND (unknown id), FAILED_PRECONDITION (not the
  // current incarnation).
  absl::Status Deregister(const std::string& worker_id, int64_t incarnation);

  // All workers ever registered, in every state, ordered by id number
  // (w-2 before w-10).
  std::vector<v1::Worker> List() const;
  // NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Worker> Get(const std::string& worker_id) const;
  // Ids of the READY workers a job may be given, ordered by id number: not
  // those still stopping their last job (see Release).
  std::vector<std::string> ReadyWorkers() const;
  // The worker records List, Get and ReadyWorkers have gone through so far
  // (one a Get, every record a List or ReadyWorkers): for tests that bound
  // how much of the registry a caller reads under its own lock (a
  // scheduling pass). Thread-safe.
  int64_t RecordsReadForTesting() const;

  // The worker's current NCCL unique id (see above); empty when it has none
  // or it was consumed and no fresh one has arrived yet.
  // Possible errors: NOT_FOUND for an unknown id.
  absl::StatusOr<std::string> NcclUniqueId(const std::string& worker_id) const;
  // Clears the worker's NCCL unique id if it still is `id` (the one the
  // caller read with NcclUniqueId and put into a device group), and returns
  // true; false, changing nothing, when the worker is unknown, `id` is empty
  // or the worker's id is another (already consumed, or replaced by a
  // heartbeat since it was read).
  bool ConsumeNcclUniqueId(const std::string& worker_id, const std::string& id);

  // Assigns all of `worker_ids` to `job_id`, or none of them. They become
  // ASSIGNED with job_id set.
  // Possible errors:
  //   INVALID_ARGUMENT: job_id empty, worker_ids empty, or an id listed twice.
  //   NOT_FOUND: an id is unknown (the first such is named).
  //   FAILED_PRECONDITION: a worker is not READY (the first such is named
  //     with its state and job).
  absl::Status Assign(const std::vector<std::string>& worker_ids, const std::string& job_id);
  // Returns the job's ASSIGNED workers to READY and clears their job_id.
  // One whose last heartbeat reported an instruction of the job (not
  // "idle") has yet to be heard stopping it: it is left out of
  // ReadyWorkers, and shows "stopping job J (no heartbeat since)", until a
  // heartbeat reports it idle after the job (its last_job_id the job's; a
  // live worker sends one as soon as its STOP is done). A worker that hangs is thus not given the
  // next job before its lease runs out and marks it LOST. LOST (and LEFT) workers lost from the job
  // stay so, their job_id and current instruction cleared: until then they show what they were
  // doing.
  void Release(const std::string& job_id);

  // Whether the worker's process can no longer be writing for a job that
  // ended at `since` (by the injected clock): it reported idle (no job
  // runner, so none of its files open) in a heartbeat received at or after
  // `since` that named the job it was released from last, or it is LOST,
  // LEFT or unknown; not one restored LOST (perhaps live when the old
  // coordinator stopped) that has not registered again since, which may
  // still run a stage of a job that ended before the restart.
  bool StoppedSince(const std::string& worker_id, absl::Time since) const;

  // The staleness check: every live worker silent for longer than `lease`
  // (by the injected clock) becomes LOST; returns how many. The loss
  // listener fires for those that were ASSIGNED.
  int CheckLeases();
  // Replaces the loss listener (empty: none).
  void SetLossListener(LossListener listener);

  // Restarts every live worker's lease now: for a coordinator that was
  // itself stalled for `stalled` (a paused VM, swapping, a debugger), when
  // no heartbeat could be taken, so silence says nothing of the workers. A
  // worker that died meanwhile is LOST one lease later (or as soon as its
  // assignment stream closes). Logs a warning naming the stall.
  void RenewLeasesAfterStall(absl::Duration stalled);
  // Whether a staleness check that came `since_last` after the one before
  // (real time; they are `period` apart) says the coordinator was stalled:
  // later than period + lease / 2.
  static bool CheckerWasStalled(absl::Duration since_last, absl::Duration period,
                                absl::Duration lease);

  // Starts a thread that calls CheckLeases every heartbeat_interval / 2 of
  // real time, after RenewLeasesAfterStall when it ran late
  // (CheckerWasStalled). No-op if it already runs. Restartable after Stop.
  void StartStalenessLoop();
  // Stops and joins the staleness loop; no-op if it does not run. Must not be
  // called from the loss listener (the loop thread would join itself).
  void Stop();

  // Number of workers per state, for metrics: every state from JOINING to
  // LEFT is present, with 0 where there are none.
  std::map<v1::WorkerState, int> CountByState() const;

  // Blocks until at least n workers are READY (true) or `timeout` of real
  // time passes (false). n <= 0 returns true at once.
  bool AwaitReadyCount(int n, absl::Duration timeout) const;

 private:
  struct Entry {
    v1::Worker worker;
    absl::Time last_seen;          // last heartbeat or registration (clock_)
    absl::Time lease_start;        // the same, or a lease renewed after a stall (lease_clock_)
    std::string nccl_unique_id;    // current; empty: none
    std::string consumed_nccl_id;  // the last one consumed, any incarnation
    std::string session_secret;    // the current incarnation's (hex)
    // The RegisterWorkerRequest.registration_id that made the current
    // incarnation (its retries get the same answer) until its first
    // heartbeat; then empty. Not stored.
    std::string registration_id;
    // The incarnation before's (IsStaleSession); empty after a restore.
    std::string previous_secret;
    // Released from a job while its last report was one of that job's
    // instructions, and no idle heartbeat since (see Release).
    bool stopping = false;
    // The job Release released it from last: only an idle heartbeat that
    // names it (HeartbeatRequest.last_job_id) clears `stopping` and moves
    // last_idle. Empty: none since it registered.
    std::string released_job;
    // The last heartbeat that reported the worker idle (running no job).
    absl::Time last_idle = absl::InfinitePast();
    // Restored LOST and not heard from since: the process may still be
    // running a job of the old coordinator's (StoppedSince).
    bool restored_unheard = false;
    absl::Time restored_at = absl::InfinitePast();  // when Restore made it (lease_clock_)
    // Why the current incarnation is LOST (a heartbeat refused then says
    // it): its lease expired, or its assignment stream closed.
    std::string lost_why;
  };
  struct Loss {
    std::string worker_id;
    std::string job_id;
    std::string reason;
    int64_t incarnation = 0;  // the one that dropped out
  };

  // Non-empty and not the entry's last consumed id.
  static bool IsFreshNcclId(const Entry& entry, const std::string& id);
  absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request) const;
  // The entry of `data_address`, created (evicting one if full) when new;
  // RESOURCE_EXHAUSTED when full with nothing to evict.
  absl::StatusOr<Entry*> EntryForAddressLocked(const std::string& data_address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the LEFT or LOST entry seen longest ago, but not one
  // AwaitedSinceRestoreLocked; false when none.
  bool EvictOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restored (not LEFT), not heard from since, and restored no more than a
  // lease ago on lease_clock_: its process may be alive and about to
  // register again (IsStaleSession, EvictOneLocked).
  bool AwaitedSinceRestoreLocked(const Entry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartIncarnationLocked(Entry& entry, const v1::RegisterWorkerRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::string SessionTokenOf(const Entry& entry);
  // nullptr when no worker has this id.
  Entry* FindLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* FindLocked(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckIncarnationLocked(const Entry& entry, int64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckAssignableLocked(const std::vector<std::string>& worker_ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The only place states change: checks the transition against the diagram
  // (a broken invariant aborts) and keeps counts_ in step.
  void SetStateLocked(Entry& entry, v1::WorkerState to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(Entry& entry, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Notify(const LossListener& listener, const std::vector<Loss>& losses);
  void RunStalenessLoop();
  // Queues options_.persist(worker) on store_queue_ (posted under mu_, so
  // saves run in the order of the changes); its result once it ran. OK at
  // once without persist.
  std::future<absl::Status> SaveLocked(const v1::Worker& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues options_.forget(worker_id) likewise.
  void ForgetLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ready (OK) once the store work queued so far has run: a caller that
  // waits for it, off the lock, returns with its saves and forgets done.
  std::future<absl::Status> StoreWorkDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestoreLocked(const std::vector<v1::Worker>& all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Clock* const clock_;
  Clock* const lease_clock_;

  mutable AnnotatedMutex mu_;
  // Keyed by id number, so iteration is in id order.
  std::map<int64_t, Entry> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> number_by_address_ ABSL_GUARDED_BY(mu_);
  int64_t last_number_ ABSL_GUARDED_BY(mu_) = 0;
  // Indexed by v1::WorkerState.
  std::array<int, v1::WorkerState_ARRAYSIZE> counts_ ABSL_GUARDED_BY(mu_) = {};
  LossListener listener_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  mutable int64_t records_read_ ABSL_GUARDED_BY(mu_) = 0;  // RecordsReadForTesting

  // Serialises StartStalenessLoop and Stop; never held by the loop thread.
  AnnotatedMutex loop_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread loop_ ABSL_GUARDED_BY(loop_mu_);

  // Where persist and forget run (see Options::persist). Last: destroyed
  // first, running what is queued while the rest still exists.
  SerialExecutor store_queue_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_REGISTRY_WORKER_REGISTRY_H_
