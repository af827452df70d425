// MemoryStore: a Store kept in a std::map, for tests and for a coordinator
// run without --state-dir.
//
// It keeps the Store contract (coordinator/store/store.h) except durability:
// everything is lost when the process exits. Commit validates the whole
// batch before changing anything, so a bad write leaves the map as it was.
// Key rules beyond CheckStoreKey, shared with SqliteStore: a kDeletePrefix
// prefix must itself pass CheckStoreKey (so "" cannot wipe the store), and
// Scan and Get take a key that passes CheckStoreKey, or "" for Scan meaning
// every key.
//
// Thread-safe: one mutex guards the map; Scan copies what it returns.
#ifndef PIPETRAIN_COORDINATOR_STORE_MEMORY_STORE_H_
#define PIPETRAIN_COORDINATOR_STORE_MEMORY_STORE_H_

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "coordinator/store/store.h"

namespace pipetrain {

class MemoryStore final : public Store {
 public:
  MemoryStore() = default;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // Errors: INVALID_ARGUMENT for a bad key or an oversized value, naming the
  // write's index; nothing is applied then.
  absl::Status Commit(const std::vector<StoreWrite>& writes) override;
  // Errors: INVALID_ARGUMENT for a bad key.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key) const override;
  // Errors: INVALID_ARGUMENT for a non-empty prefix that is not a valid key.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix) const override;
  // "memory".
  std::string Describe() const override;

 private:
  mutable AnnotatedMutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_MEMORY_STORE_H_
