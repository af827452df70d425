// SqliteStore: the coordinator's durable state in an embedded SQLite
// database under --state-dir (the default backend; see store.h).
//
// Files in the state dir (created with mode 0700 if missing; its parent
// must exist):
//   coordinator.db      the database (created with mode 0600; SQLite gives
//                       its -wal and -shm files the same mode)
//   coordinator.lock    flock(2)ed for the store's life; holds the owner's pid
//   coordinator.db.new  only while Open builds a new database: the file gets
//                       its tables under this name and is then renamed, so
//                       coordinator.db never exists without them. A crash
//                       there leaves this file, which the next Open removes.
//
// Every commit is checkpointed into the database file as it is made
// (wal_autocheckpoint=1; a checkpoint a reader blocks, or one that fails,
// leaves commits in the WAL until the next), and Open checkpoints what a
// crash left in the WAL, best effort (a full disk leaves it there: SQLite
// reads commits from the WAL, and the coordinator starts). A plain copy of the .db file taken while the
// coordinator runs is not a backup: a checkpoint rewrites pages in place as
// the copy reads them, so the copy can pair an old page with a new one and
// silently lack records (SQLite reads it without an error). Back up with
// sqlite3's .backup (or VACUUM INTO), an atomic snapshot of the filesystem
// holding the directory, or a copy made while the coordinator is stopped.
//
// Durability: the database runs in WAL mode with synchronous=FULL, so Commit
// returns only after the WAL has been fsync()ed; SQLite documents that this
// makes a committed transaction survive power loss, not just a process
// crash (https://www.sqlite.org/pragma.html#pragma_synchronous). That holds
// on a local filesystem whose fsync tells the truth; NFS and similar are not
// supported (WAL needs shared memory on the same host anyway).
//
// Exclusive ownership: one coordinator process per state dir. The lock file
// is held with flock(LOCK_EX | LOCK_NB), which the kernel releases when the
// process dies, however it dies, so a crashed coordinator never leaves a
// stale lock behind. A second Open of the same dir, from another process or
// from this one, is refused while the first store lives.
//
// Schema: table kv(key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID, keys
// compared bytewise (SQLite's BINARY collation), and schema_version holding
// kSchemaVersion. A database written by a newer coordinator is refused, not
// modified.
//
// Keys: as MemoryStore (coordinator/store/memory_store.h): every key, and a
// kDeletePrefix prefix, must pass CheckStoreKey; Scan also takes "" for
// every key. Keys and values are checked before the database is touched.
//
// Errors of every method (besides the INVALID_ARGUMENT of store.h):
//   UNAVAILABLE   the database is locked by another process (for example an
//                 operator's sqlite3 shell) for longer than the busy timeout;
//                 retry.
//   DATA_LOSS     the database file is corrupt or not a database, or (at
//                 Open) it existed but holds no tables (e.g. truncated):
//                 never started empty in silence; the message names the
//                 file.
//   INTERNAL      any other SQLite or I/O error, with SQLite's message.
//
// Thread-safe. One connection serves every call, serialised by a mutex:
// simple and correct, and enough for the coordinator's write rate, whose
// cost is the fsync per Commit rather than the lock.
#ifndef PIPETRAIN_COORDINATOR_STORE_SQLITE_STORE_H_
#define PIPETRAIN_COORDINATOR_STORE_SQLITE_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "common/confined_path.h"
#include "coordinator/store/store.h"

struct sqlite3;

namespace pipetrain {

class SqliteStore final : public Store {
 public:
  // The layout this build reads and writes. Raise it with a migration in
  // sqlite_store.cc when the layout changes.
  static constexpr int kSchemaVersion = 1;
  static constexpr char kDatabaseFileName[] = "coordinator.db";
  static constexpr char kLockFileName[] = "coordinator.lock";
  // Appended to kDatabaseFileName while a new database is built.
  static constexpr char kNewDatabaseSuffix[] = ".new";

  // Opens (creating if needed) the store in `state_dir`.
  // Errors:
  //   INVALID_ARGUMENT     `state_dir` is empty.
  //   FAILED_PRECONDITION  the dir is in use by another coordinator ("state
  //                        dir X is in use by another coordinator (pid N)"),
  //                        or exists but is not a directory, or the database
  //                        has a newer schema version than kSchemaVersion
  //                        (the message names both), or the filesystem
  //                        cannot run WAL mode.
  //   DATA_LOSS            the database file is corrupt.
  //   errno-derived codes  (NOT_FOUND, PERMISSION_DENIED, ...) when the dir
  //                        or a file in it cannot be created or opened,
  //                        naming the path.
  //   UNAVAILABLE, INTERNAL as above.
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& state_dir);

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // One BEGIN IMMEDIATE ... COMMIT transaction; an empty batch is a no-op.
  absl::Status Commit(const std::vector<StoreWrite>& writes) override;
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key) const override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix) const override;
  // "sqlite:<state_dir>/coordinator.db".
  std::string Describe() const override;

 private:
  struct Statements;  // Prepared statements (sqlite_store.cc).

  SqliteStore(std::string db_path, ScopedFd lock, sqlite3* db,
              std::unique_ptr<Statements> statements);

  // Runs one write inside the open transaction.
  absl::Status ApplyLocked(const StoreWrite& write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string db_path_;
  const ScopedFd lock_;  // Outlives the connection: released last.
  mutable AnnotatedMutex mu_;
  sqlite3* const db_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Statements> statements_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_SQLITE_STORE_H_
