// EtcdStore: the coordinator's durable state in etcd (store.h), for highly
// available coordinators: two or more coordinators share one etcd cluster
// and one key prefix, and the one that LeaderElection elects writes.
//
// Layout: Store key K is etcd key "<prefix>kv/K"; "<prefix>leader" is the
// election's (leader_election.h) and "<prefix>seq" the write sequence
// (below), both out of reach of Store keys. Values are stored as given.
//
// Commit is one etcd Txn, so a batch applies all or nothing. Durability:
// etcd answers a Txn only once a quorum of its members has written it to
// their raft log (etcd's WAL) and fsync()ed it, so a Commit that returned
// OK survives the loss of any minority of members and a restart of all of
// them, power loss included where the disks' fsync tells the truth. A
// Commit that returned UNAVAILABLE may or may not have been applied, and
// may still be applied later: a member that accepted it and then stalled
// forwards it when it resumes, after later Commits went through another
// member. Retrying it is safe, because a batch sets keys to values and
// deletes keys regardless of what was there; applying it late is not, as
// it would undo those later Commits (a job's final save, a compensating
// delete). Hence the write sequence: every Commit's Txn also requires the
// sequence key's mod_revision to be the one this store last saw, and puts
// the key, so once any later Commit has succeeded an earlier Txn's compare
// fails and it changes nothing. The store reads the sequence key before its
// first Commit and again after a Commit that failed (it may have been
// applied); after a successful one it knows the revision it wrote. A Txn
// that fails only on the sequence key is sent again once, expecting the
// revision its failure branch read; the batch is still the caller's latest
// intent. With a LeadershipView nobody else writes meanwhile (the leader
// fence below); without one, stores that share a prefix make each other's
// Commits retry, and a Commit that meets a changed key twice returns
// UNAVAILABLE. An empty batch writes nothing, so it carries no sequence.
//
// etcd refuses a Txn that writes one key twice, or puts a key that one of
// its deletes covers. Commit therefore sends the batch's net effect: the
// last value put to each key, and the deleted key ranges minus the keys
// put after the delete. The result, plus the put of the sequence key, must
// fit etcd's limits, which EtcdOptions repeats: at most max_txn_ops
// operations (a delete of a prefix under which the batch puts n keys counts
// n + 1; a batch of puts alone may hold max_txn_ops - 1) and
// max_request_bytes.
//
// Leader fence: with a LeadershipView (a LeaderElection), every Commit's Txn
// requires the leader key to still have the create_revision of the term
// this coordinator leads, so a coordinator that is not, or no longer, the
// leader cannot write, even before its election notices.
//
// History: etcd keeps every revision of every key until it is compacted,
// and does not compact by default, while a coordinator saves each running
// job's record (tens of KB with its loss history) up to once a second:
// etcd's default 2 GiB quota filled within a day, after which etcd refused
// every write (NOSPACE) and no coordinator could be elected. So every
// options.compaction_interval_commits successful Commits, or sooner once
// those since the last compaction carried options.compaction_interval_bytes
// (records may be up to 1 MiB: a thousand of them alone fill half the
// quota), the store compacts etcd up to options.kept_revisions revisions
// before the one it just wrote, or nearer, so that its own Commits kept
// carry at most options.compaction_interval_bytes (the newest is always
// kept); so what this store's Commits that returned keep in etcd's
// history is bounded by about twice that many bytes, whatever the
// records' size (one applied after it timed out is not counted) (a failure is logged
// and tried again after the next interval; the Commit stands). Only the writer compacts, and Scan
// reads again when its revision was compacted meanwhile. etcd's own --auto-compaction-* flags may
// run beside it.
//
// Reads are linearizable (etcd's default): they see every Commit that
// returned, from any coordinator. Scan reads pages of at most
// scan_page_keys keys, all at the revision of the first page, so it returns
// one consistent snapshot; a page over kMaxEtcdResponseBytes is read again
// at half the size.
//
// Keys: as MemoryStore (memory_store.h): every key, and a kDeletePrefix
// prefix, must pass CheckStoreKey; Scan also takes "" for every key. They
// are checked before etcd is contacted.
//
// Errors of every method (besides the INVALID_ARGUMENT of store.h):
//   UNAVAILABLE          no endpoint answered in time (etcd down, no raft
//                        leader, partitioned); or Commit only, the sequence
//                        key changed twice under it (another store writes
//                        the prefix); retry.
//   FAILED_PRECONDITION  Commit only, with a LeadershipView: "not the
//                        leader (leader is X)"; send the write to X.
//   INVALID_ARGUMENT     also a batch over etcd's limits (see above),
//                        naming the limit.
//   PERMISSION_DENIED, UNAUTHENTICATED  etcd's auth refuses this client (no
//                        certificate or user, a wrong password, or no read
//                        and write on the prefix; etcd_client.h).
//   INTERNAL             anything else, with etcd's message.
//
// Thread-safe: the client is, and the compaction counters are atomics.
// Commits are serialised by a mutex, so that one thread's Commit does not
// fail another's sequence compare; each holds it for its etcd round trips
// (milliseconds, or up to rpc_timeout per endpoint while etcd is
// unreachable). Get and Scan do not take it.
#ifndef PIPETRAIN_COORDINATOR_STORE_ETCD_STORE_H_
#define PIPETRAIN_COORDINATOR_STORE_ETCD_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/leader_election.h"
#include "coordinator/store/store.h"

namespace pipetrain {

class EtcdStore final : public Store {
 public:
  // Connects and reads once, so that a wrong endpoint fails here.
  // `leadership`, when not null, fences every Commit (see above) and must
  // outlive the store; null means no fence (a single coordinator, tests).
  // Errors: INVALID_ARGUMENT for bad options; UNAVAILABLE when no endpoint
  // answers; the others above.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Open(
      EtcdOptions options, const LeadershipView* leadership = nullptr);

  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  // One Txn (two where the sequence key changed; see above); an empty batch
  // is a no-op without a fence, and a leadership check with one.
  absl::Status Commit(const std::vector<StoreWrite>& writes) override;
  // Tests only: the Txn the next Commit of `writes` would send first, built
  // as Commit builds it (reading the sequence key where it is unknown), not
  // sent. Errors: Commit's, short of those of the Txn itself.
  absl::StatusOr<etcdserverpb::TxnRequest> BuildTxnForTesting(
      const std::vector<StoreWrite>& writes);
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key) const override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix) const override;
  // "etcd:host1:2379,host2:2379 prefix /pipetrain/".
  std::string Describe() const override;

 private:
  EtcdStore(std::unique_ptr<EtcdClient> client, const LeadershipView* leadership);

  // The etcd key of Store key `key`.
  std::string DataKey(const std::string& key) const { return data_prefix_ + key; }
  // The term that fences this Commit (nullopt without a LeadershipView), or
  // FAILED_PRECONDITION when this coordinator does not lead.
  absl::StatusOr<std::optional<LeaderTerm>> FencingTerm() const;
  // The Txn of `writes` (checked), fenced on `term` where there is one and,
  // unless it writes nothing, on the sequence key at seq_revision_ (read
  // first where unknown). INVALID_ARGUMENT over etcd's limits.
  absl::StatusOr<etcdserverpb::TxnRequest> BuildTxn(const std::vector<StoreWrite>& writes,
                                                    const std::optional<LeaderTerm>& term)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_);
  // Reads the sequence key's mod_revision into seq_revision_ (0: absent).
  absl::Status ReadSequence() ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_);
  // Counts a successful Commit of `bytes` (its Txn) that wrote `revision`,
  // and compacts etcd's history when an interval is up (see above).
  void MaybeCompact(int64_t revision, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_);
  // One pass of Scan over [begin, end); OUT_OF_RANGE when etcd compacted
  // the revision it reads at.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ScanOnce(
      const std::string& begin, const std::string& end) const;

  const std::unique_ptr<EtcdClient> client_;
  const LeadershipView* const leadership_;
  const std::string data_prefix_;  // "<prefix>kv/"
  const std::string seq_key_;      // "<prefix>seq"
  AnnotatedMutex commit_mu_;       // held through each Commit
  // The sequence key's mod_revision as this store last saw it; nullopt
  // until read, and again after a Commit that failed.
  std::optional<int64_t> seq_revision_ ABSL_GUARDED_BY(commit_mu_);
  std::atomic<int64_t> commits_{0};
  std::atomic<int64_t> bytes_since_compaction_{0};  // of Commits since the last try
  // (revision, Txn bytes) of this store's latest Commits, oldest first, at
  // most kept_revisions: how near a compaction goes to keep the bytes bound.
  std::deque<std::pair<int64_t, int64_t>> recent_ ABSL_GUARDED_BY(commit_mu_);
  std::atomic<int64_t> compacted_to_{0};  // the latest revision compacted up to
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_ETCD_STORE_H_
