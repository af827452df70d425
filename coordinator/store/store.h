// Store: the coordinator's durable state, as an ordered key-value map with
// atomic batches (DESIGN.md §11). Backends: SqliteStore (embedded, the
// default: --state-dir), MemoryStore (tests, and --state-dir unset), and
// EtcdStore for highly available coordinators (--etcd-endpoints,
// etcd_store.h).
//
// Keys are printable ASCII paths ("jobs/job-abc-1", "workers/w-3"); values
// are opaque bytes (serialized protos). The typed layout on top lives with
// its owners (coordinator/store/coordinator_state.h), never here.
//
// Contract every backend keeps:
//   - Commit applies all of its writes or none, and returns only once they
//     are durable: a process killed (SIGKILL, or the machine losing power
//     where the backend says so) after Commit returned OK finds them after
//     a restart; one killed before finds none of them.
//   - Reads see every committed write (read-your-writes, one process).
//   - Scan returns keys with the prefix in ascending byte order.
//   - Thread-safe: any thread may call any method.
// Errors: INVALID_ARGUMENT for a key that is empty, longer than kMaxKeyBytes
// or not printable ASCII, or a value over kMaxValueBytes; UNAVAILABLE when
// the backend cannot be reached now (retry); DATA_LOSS when its files are
// corrupt; INTERNAL for anything else, with the backend's message.
#ifndef PIPETRAIN_COORDINATOR_STORE_STORE_H_
#define PIPETRAIN_COORDINATOR_STORE_STORE_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain {

inline constexpr size_t kMaxKeyBytes = 512;
// etcd's default request limit is 1.5 MiB; a value stays under it.
inline constexpr size_t kMaxValueBytes = 1 << 20;

struct StoreWrite {
  enum class Kind { kPut, kDelete, kDeletePrefix };
  Kind kind = Kind::kPut;
  std::string key;    // the key, or the prefix for kDeletePrefix
  std::string value;  // kPut only

  static StoreWrite Put(std::string key, std::string value) {
    return {Kind::kPut, std::move(key), std::move(value)};
  }
  static StoreWrite Delete(std::string key) { return {Kind::kDelete, std::move(key), {}}; }
  static StoreWrite DeletePrefix(std::string prefix) {
    return {Kind::kDeletePrefix, std::move(prefix), {}};
  }
};

class Store {
 public:
  virtual ~Store() = default;

  // Applies `writes` in order, atomically and durably (see above).
  virtual absl::Status Commit(const std::vector<StoreWrite>& writes) = 0;
  // The value at `key`, or nullopt when absent.
  virtual absl::StatusOr<std::optional<std::string>> Get(const std::string& key) const = 0;
  // Every (key, value) whose key starts with `prefix`, ascending by key.
  virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix) const = 0;
  // For logs and /healthz: "sqlite:/var/lib/pipetrain/coordinator.db".
  virtual std::string Describe() const = 0;
};

// OK, or INVALID_ARGUMENT naming what is wrong with `key` (see above).
absl::Status CheckStoreKey(const std::string& key);

// What a Get or a Scan read back, checked before it is copied or used:
// DATA_LOSS naming `where` (the store) and the key (escaped, cut to 64
// bytes) when the key fails CheckStoreKey or the value is over
// kMaxValueBytes. Every write passes both, so such an entry is damage, or
// another program's write; the coordinator must not allocate or log
// whatever it holds.
absl::Status CheckStoredEntry(absl::string_view where, absl::string_view key, size_t value_bytes);

// OK when every write's key passes CheckStoreKey and every put's value is
// at most kMaxValueBytes; INVALID_ARGUMENT naming the first bad write (its
// index) otherwise. Every Store checks a batch so before applying any of it,
// which keeps a Commit all or nothing.
absl::Status CheckStoreWrites(const std::vector<StoreWrite>& writes);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_STORE_H_
