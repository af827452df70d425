#include "coordinator/store/memory_store.h"

#include "absl/strings/match.h"

namespace pipetrain {

absl::Status MemoryStore::Commit(const std::vector<StoreWrite>& writes) {
  absl::Status valid = CheckStoreWrites(writes);
  if (!valid.ok()) return valid;
  AnnotatedMutexLock lock(&mu_);
  for (const StoreWrite& w : writes) {
    switch (w.kind) {
      case StoreWrite::Kind::kPut:
        data_[w.key] = w.value;
        break;
      case StoreWrite::Kind::kDelete:
        data_.erase(w.key);
        break;
      case StoreWrite::Kind::kDeletePrefix: {
        auto it = data_.lower_bound(w.key);
        while (it != data_.end() && absl::StartsWith(it->first, w.key)) it = data_.erase(it);
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> MemoryStore::Get(const std::string& key) const {
  absl::Status valid = CheckStoreKey(key);
  if (!valid.ok()) return valid;
  AnnotatedMutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> MemoryStore::Scan(
    const std::string& prefix) const {
  if (!prefix.empty()) {
    absl::Status valid = CheckStoreKey(prefix);
    if (!valid.ok()) return valid;
  }
  std::vector<std::pair<std::string, std::string>> found;
  AnnotatedMutexLock lock(&mu_);
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
    found.emplace_back(it->first, it->second);
  }
  return found;
}

std::string MemoryStore::Describe() const { return "memory"; }

}  // namespace pipetrain
