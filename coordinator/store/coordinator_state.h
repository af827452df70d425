// CoordinatorState: the typed layout of the coordinator's durable state on a
// Store (store.h). Keys:
//
//   meta/version            the layout version (kStateVersion)
//   meta/profile_sequence   the last store_sequence a profile was saved with
//   workers/<id>            StoredWorker (state.proto)
//   jobs/<id>               StoredJob
//   profiles/<key>          v1::ModelProfile (jobs/profile_cache.h keys),
//                           store_sequence set
//
// Every Save returns once the store committed it (durable: store.h), so a
// caller that acknowledges only after Save never acknowledges what a
// restart could lose. Thread-safe (the store is).
//
// Each record's value carries a SHA-256 of the message ahead of it
// (coordinator_state.cc): a Load finds a record changed since it was
// saved (DATA_LOSS naming its key), which SQLite, checking no page's
// contents, would not. A record without one (saved by an earlier version)
// is read as it is, and sealed at its next save.
#ifndef PIPETRAIN_COORDINATOR_STORE_COORDINATOR_STATE_H_
#define PIPETRAIN_COORDINATOR_STORE_COORDINATOR_STATE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/store/state.pb.h"
#include "coordinator/store/store.h"
#include "proto/pipetrain/v1/profile.pb.h"

namespace pipetrain {

inline constexpr int kStateVersion = 1;

// What a record's seal adds to its serialised message (see above): a
// message may hold kMaxValueBytes less this.
inline constexpr size_t kSealedRecordOverheadBytes = 11 + 64;

class CoordinatorState {
 public:
  // `store` is not owned and must outlive this.
  explicit CoordinatorState(Store* store) : store_(store) {}

  // Writes the layout version into an empty store, or checks it:
  // FAILED_PRECONDITION naming both versions when the store was written by
  // another layout.
  absl::Status Initialize();

  // Keeps what a restart needs of `worker` (id, data address, latest
  // incarnation, device facts, addresses, last heartbeat, whether it is
  // LEFT or drained; no other state, no session).
  absl::Status SaveWorker(const v1::Worker& worker);
  // The saved workers: LEFT if they were saved so, else their state unset.
  absl::StatusOr<std::vector<v1::Worker>> LoadWorkers() const;
  // Drops a worker's record (the registry no longer keeps it).
  absl::Status DeleteWorker(const std::string& worker_id);

  absl::Status SaveJob(const store::StoredJob& job);
  absl::Status DeleteJob(const std::string& job_id);
  // In key order; DATA_LOSS naming the key when a value does not parse or
  // does not match its checksum (so do the other Loads). A record whose key
  // is not kJobs + its job's id is left out, with a warning.
  absl::StatusOr<std::vector<store::StoredJob>> LoadJobs() const;

  // Saves `profile` numbered one past meta/profile_sequence (store_sequence),
  // and that number there, in one commit: numbers rise across restarts.
  // Two saves at once may take the same number (LoadProfilesBySave then
  // orders them by key). DATA_LOSS when meta/profile_sequence is not a
  // number.
  absl::Status SaveProfile(const std::string& key, const v1::ModelProfile& profile);
  absl::Status DeleteProfile(const std::string& key);
  // The saved profiles, least recently saved first: by store_sequence, then
  // key (records saved before it was kept have none and come first, in key
  // order). Why: a restarted coordinator puts them back in its cache in
  // this order, which evicts the least recently used; in key order it
  // evicted the alphabetically first, however recently measured. Returned
  // with store_sequence cleared (so do LoadProfiles).
  absl::StatusOr<std::vector<std::pair<std::string, v1::ModelProfile>>> LoadProfilesBySave() const;
  // The same, by key.
  absl::StatusOr<std::map<std::string, v1::ModelProfile>> LoadProfiles() const;

  std::string Describe() const { return store_->Describe(); }

 private:
  Store* const store_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_COORDINATOR_STATE_H_
