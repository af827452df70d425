// For tests: a Store over a MemoryStore whose commits a test controls (fail
// them, hang them, lose their answers), reading through as it is. A
// subclass overrides Commit (calling CommitThrough to apply) and Describe.
//
//   class FailingStore final : public MemoryBackedStore {
//    public:
//     absl::Status Commit(const std::vector<StoreWrite>& writes) override {
//       if (failing.load()) return absl::UnavailableError("the store is unreachable");
//       return CommitThrough(writes);
//     }
//     std::atomic<bool> failing{false};
//   };
#ifndef PIPETRAIN_COORDINATOR_STORE_MEMORY_BACKED_STORE_TESTING_H_
#define PIPETRAIN_COORDINATOR_STORE_MEMORY_BACKED_STORE_TESTING_H_

#include <atomic>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/store.h"

namespace pipetrain {

class MemoryBackedStore : public Store {
 public:
  absl::Status Commit(const std::vector<StoreWrite>& writes) override {
    return CommitThrough(writes);
  }
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key) const override {
    return store_.Get(key);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix) const override {
    return store_.Scan(prefix);
  }
  std::string Describe() const override { return "memory-backed test store"; }

 protected:
  // Applies `writes` to the memory store underneath.
  absl::Status CommitThrough(const std::vector<StoreWrite>& writes) {
    return store_.Commit(writes);
  }

 private:
  MemoryStore store_;
};

// Holds the next commit after `hold` is set (a store that stopped
// answering: an etcd call waiting out its deadline, a hung file system)
// until `release` is set; `entered` is set once it holds.
//
//   store.hold = true;
//   ... something that commits, on another thread ...
//   store.entered.get_future().wait();
//   ... what is seen meanwhile ...
//   store.release.set_value();
class HeldCommitStore final : public MemoryBackedStore {
 public:
  absl::Status Commit(const std::vector<StoreWrite>& writes) override {
    if (hold.exchange(false)) {
      entered.set_value();
      released.wait();
    }
    return CommitThrough(writes);
  }
  std::string Describe() const override { return "held"; }
  std::atomic<bool> hold{false};
  std::promise<void> entered;
  std::promise<void> release;

 private:
  std::shared_future<void> released = release.get_future().share();
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_MEMORY_BACKED_STORE_TESTING_H_
