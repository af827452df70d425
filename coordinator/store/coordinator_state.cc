#include "coordinator/store/coordinator_state.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "google/protobuf/message.h"

namespace pipetrain {
namespace {

constexpr char kVersionKey[] = "meta/version";
constexpr char kProfileSequenceKey[] = "meta/profile_sequence";
constexpr char kWorkers[] = "workers/";
constexpr char kJobs[] = "jobs/";
constexpr char kProfiles[] = "profiles/";

// A record's value: kSealPrefix, the SHA-256 (hex) of the serialised
// message, then the message. SQLite checks no page's contents, so bytes
// changed on the disk inside a record that still parses would otherwise be
// read as state. The prefix starts with a NUL, which no serialised message
// of these types does (field number 0 does not exist), so a record written
// before seals existed is told apart and read as it is.
constexpr absl::string_view kSealPrefix("\0pt-sha256:", 11);
constexpr size_t kSealBytes = kSealPrefix.size() + 64;
static_assert(kSealBytes == kSealedRecordOverheadBytes, "coordinator_state.h says so");

std::string Sealed(const google::protobuf::Message& message) {
  const std::string payload = message.SerializeAsString();
  return absl::StrCat(kSealPrefix, Sha256Hex(payload), payload);
}

// Parses the value of `key`: DATA_LOSS naming the key when its seal does
// not match or it does not parse.
absl::Status Unseal(const Store& store, const std::string& key, absl::string_view value,
                    google::protobuf::Message* message) {
  if (absl::StartsWith(value, kSealPrefix)) {
    if (value.size() < kSealBytes ||
        Sha256Hex(value.substr(kSealBytes)) !=
            value.substr(kSealPrefix.size(), kSealBytes - kSealPrefix.size())) {
      return absl::DataLossError(absl::StrCat(
          store.Describe(), ": ", key,
          " does not match its checksum (changed on disk?); restore the state from a backup, or "
          "delete that record"));
    }
    value.remove_prefix(kSealBytes);
  }
  if (!message->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return absl::DataLossError(absl::StrCat(store.Describe(), ": ", key, " does not parse"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CoordinatorState::Initialize() {
  ASSIGN_OR_RETURN(std::optional<std::string> version, store_->Get(kVersionKey));
  if (!version.has_value()) {
    return store_->Commit({StoreWrite::Put(kVersionKey, absl::StrCat(kStateVersion))});
  }
  int stored = 0;
  if (!absl::SimpleAtoi(*version, &stored) || stored != kStateVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(store_->Describe(), " holds state of layout version ", version->substr(0, 16),
                     "; this coordinator reads version ", kStateVersion));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::SaveWorker(const v1::Worker& worker) {
  store::StoredWorker stored;
  stored.set_id(worker.id());
  stored.set_data_address(worker.data_address());
  stored.set_incarnation(worker.incarnation());
  *stored.mutable_device() = worker.device();
  stored.set_metrics_address(worker.metrics_address());
  stored.set_node_name(worker.node_name());
  stored.set_left(worker.state() == v1::WORKER_STATE_LEFT);
  stored.set_drained(worker.drained());
  if (worker.has_build()) *stored.mutable_build() = worker.build();
  *stored.mutable_last_heartbeat() = worker.last_heartbeat();
  return store_->Commit({StoreWrite::Put(kWorkers + worker.id(), Sealed(stored))});
}

absl::StatusOr<std::vector<v1::Worker>> CoordinatorState::LoadWorkers() const {
  ASSIGN_OR_RETURN(auto rows, store_->Scan(kWorkers));
  std::vector<v1::Worker> out;
  for (const auto& [key, value] : rows) {
    store::StoredWorker s;
    RETURN_IF_ERROR(Unseal(*store_, key, value, &s));
    // Saved and deleted at kWorkers + its id (as jobs are): a record under
    // another key would never be removed, and would bring the worker back
    // after every restart. Left where it is.
    if (key != kWorkers + s.id()) {
      PT_LOG(WARNING) << store_->Describe() << ": " << key << " holds worker \""
                      << absl::CHexEscape(s.id().substr(0, 64))
                      << "\", which is saved under another key; not restored (delete the record)";
      continue;
    }
    v1::Worker w;
    w.set_id(s.id());
    w.set_data_address(s.data_address());
    w.set_incarnation(s.incarnation());
    *w.mutable_device() = s.device();
    w.set_metrics_address(s.metrics_address());
    w.set_node_name(s.node_name());
    w.set_drained(s.drained());
    if (s.has_build()) *w.mutable_build() = s.build();
    // Only LEFT is kept: any other was live when the coordinator stopped,
    // or lost before (a loss is not saved); WorkerRegistry::Restore makes
    // it LOST.
    if (s.left()) w.set_state(v1::WORKER_STATE_LEFT);
    *w.mutable_last_heartbeat() = s.last_heartbeat();
    out.push_back(std::move(w));
  }
  return out;
}

absl::Status CoordinatorState::SaveJob(const store::StoredJob& job) {
  return store_->Commit({StoreWrite::Put(kJobs + job.job().id(), Sealed(job))});
}

absl::Status CoordinatorState::DeleteWorker(const std::string& worker_id) {
  return store_->Commit({StoreWrite::Delete(kWorkers + worker_id)});
}

absl::Status CoordinatorState::DeleteJob(const std::string& job_id) {
  return store_->Commit({StoreWrite::Delete(kJobs + job_id)});
}

absl::StatusOr<std::vector<store::StoredJob>> CoordinatorState::LoadJobs() const {
  ASSIGN_OR_RETURN(auto rows, store_->Scan(kJobs));
  std::vector<store::StoredJob> out;
  for (const auto& [key, value] : rows) {
    store::StoredJob job;
    RETURN_IF_ERROR(Unseal(*store_, key, value, &job));
    // Saved and deleted at kJobs + its id: a record elsewhere would never be
    // updated nor removed, and after a restart could come back in place of
    // the job's own (a cancelled job RUNNING again). Left where it is.
    if (key != kJobs + job.job().id()) {
      PT_LOG(WARNING) << store_->Describe() << ": " << key << " holds job \""
                      << absl::CHexEscape(job.job().id().substr(0, 64))
                      << "\", which is saved under another key; not restored (delete the record)";
      continue;
    }
    out.push_back(std::move(job));
  }
  return out;
}

absl::Status CoordinatorState::SaveProfile(const std::string& key,
                                           const v1::ModelProfile& profile) {
  // Read at each save (profiles are saved once per profiling run): kept in
  // memory, a save before any load would number from 1 again, below every
  // stored profile.
  ASSIGN_OR_RETURN(std::optional<std::string> last, store_->Get(kProfileSequenceKey));
  int64_t sequence = 0;
  if (last.has_value() && (!absl::SimpleAtoi(*last, &sequence) || sequence < 0 ||
                           sequence == std::numeric_limits<int64_t>::max())) {
    return absl::DataLossError(
        absl::StrCat(store_->Describe(), ": ", kProfileSequenceKey, " holds \"",
                     absl::CHexEscape(last->substr(0, 32)),
                     "\", not a count of profile saves; delete that record"));
  }
  v1::ModelProfile stored = profile;
  stored.set_store_sequence(++sequence);
  return store_->Commit({StoreWrite::Put(kProfiles + key, Sealed(stored)),
                         StoreWrite::Put(kProfileSequenceKey, absl::StrCat(sequence))});
}

absl::Status CoordinatorState::DeleteProfile(const std::string& key) {
  return store_->Commit({StoreWrite::Delete(kProfiles + key)});
}

absl::StatusOr<std::vector<std::pair<std::string, v1::ModelProfile>>>
CoordinatorState::LoadProfilesBySave() const {
  ASSIGN_OR_RETURN(auto rows, store_->Scan(kProfiles));
  std::vector<std::pair<std::string, v1::ModelProfile>> out;
  out.reserve(rows.size());
  for (const auto& [key, value] : rows) {
    v1::ModelProfile p;
    RETURN_IF_ERROR(Unseal(*store_, key, value, &p));
    out.emplace_back(key.substr(sizeof(kProfiles) - 1), std::move(p));
  }
  // Stable: equal numbers (0 for records older than numbering) keep the
  // scan's key order.
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second.store_sequence() < b.second.store_sequence();
  });
  for (auto& [key, profile] : out) profile.clear_store_sequence();
  return out;
}

absl::StatusOr<std::map<std::string, v1::ModelProfile>> CoordinatorState::LoadProfiles() const {
  ASSIGN_OR_RETURN(auto by_save, LoadProfilesBySave());
  return std::map<std::string, v1::ModelProfile>(std::make_move_iterator(by_save.begin()),
                                                 std::make_move_iterator(by_save.end()));
}

}  // namespace pipetrain
