#include "coordinator/store/coordinator_state.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

constexpr char kVersionKey[] = "meta/version";
constexpr char kWorkers[] = "workers/";
constexpr char kJobs[] = "jobs/";
constexpr char kProfiles[] = "profiles/";

template <typename Message>
absl::StatusOr<std::vector<Message>> LoadAll(const Store& store, const std::string& prefix) {
  ASSIGN_OR_RETURN(auto rows, store.Scan(prefix));
  std::vector<Message> out;
  for (const auto& [key, value] : rows) {
    Message m;
    if (!m.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat(store.Describe(), ": ", key, " does not parse"));
    }
    out.push_back(std::move(m));
  }
  return out;
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
  *stored.mutable_last_heartbeat() = worker.last_heartbeat();
  return store_->Commit({StoreWrite::Put(kWorkers + worker.id(), stored.SerializeAsString())});
}

absl::StatusOr<std::vector<v1::Worker>> CoordinatorState::LoadWorkers() const {
  ASSIGN_OR_RETURN(std::vector<store::StoredWorker> stored,
                   LoadAll<store::StoredWorker>(*store_, kWorkers));
  std::vector<v1::Worker> out;
  for (const store::StoredWorker& s : stored) {
    v1::Worker w;
    w.set_id(s.id());
    w.set_data_address(s.data_address());
    w.set_incarnation(s.incarnation());
    *w.mutable_device() = s.device();
    w.set_metrics_address(s.metrics_address());
    w.set_node_name(s.node_name());
    w.set_drained(s.drained());
    // Only LEFT is kept: any other state was live when the coordinator
    // stopped (WorkerRegistry::Restore makes it LOST).
    if (s.left()) w.set_state(v1::WORKER_STATE_LEFT);
    *w.mutable_last_heartbeat() = s.last_heartbeat();
    out.push_back(std::move(w));
  }
  return out;
}

absl::Status CoordinatorState::SaveJob(const store::StoredJob& job) {
  return store_->Commit({StoreWrite::Put(kJobs + job.job().id(), job.SerializeAsString())});
}

absl::Status CoordinatorState::DeleteWorker(const std::string& worker_id) {
  return store_->Commit({StoreWrite::Delete(kWorkers + worker_id)});
}

absl::Status CoordinatorState::DeleteJob(const std::string& job_id) {
  return store_->Commit({StoreWrite::Delete(kJobs + job_id)});
}

absl::StatusOr<std::vector<store::StoredJob>> CoordinatorState::LoadJobs() const {
  return LoadAll<store::StoredJob>(*store_, kJobs);
}

absl::Status CoordinatorState::SaveProfile(const std::string& key,
                                           const v1::ModelProfile& profile) {
  return store_->Commit({StoreWrite::Put(kProfiles + key, profile.SerializeAsString())});
}

absl::Status CoordinatorState::DeleteProfile(const std::string& key) {
  return store_->Commit({StoreWrite::Delete(kProfiles + key)});
}

absl::StatusOr<std::map<std::string, v1::ModelProfile>> CoordinatorState::LoadProfiles() const {
  ASSIGN_OR_RETURN(auto rows, store_->Scan(kProfiles));
  std::map<std::string, v1::ModelProfile> out;
  for (const auto& [key, value] : rows) {
    v1::ModelProfile p;
    if (!p.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat(store_->Describe(), ": ", key, " does not parse"));
    }
    out[key.substr(sizeof(kProfiles) - 1)] = std::move(p);
  }
  return out;
}

}  // namespace pipetrain
