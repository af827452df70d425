#include "coordinator/store/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// An operator's sqlite3 shell or a backup tool may hold the database lock for
// a moment; wait this long before answering UNAVAILABLE.
constexpr int kBusyTimeoutMs = 5000;

struct StatementDeleter {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Statement = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

struct ConnectionCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Connection = std::unique_ptr<sqlite3, ConnectionCloser>;

absl::Status ErrnoError(int error_number, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error_number, absl::StrCat(what, " ", path));
}

// The status for SQLite result `rc` of `what` on the database at `path`.
absl::Status SqliteError(sqlite3* db, int rc, const std::string& path, absl::string_view what) {
  const char* message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {  // The primary code of an extended one.
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(absl::StrCat("state database ", path,
                                                 " is locked by another process (", what, ": ",
                                                 message, "); retry"));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(absl::StrCat(
          "state database ", path, " is corrupt (", what, ": ", message,
          "); restore it from a backup, or move it aside to start with empty state (its -wal "
          "and -shm files with it: a -wal belongs to its database alone)"));
    case SQLITE_FULL:
    case SQLITE_IOERR:
      // A full disk, and an exceeded quota, which SQLite reports only as
      // "disk I/O error" (its errno is not kept): the text must say what to do.
      return absl::InternalError(absl::StrCat(
          "state database ", path, ": ", what, ": ", message, " (sqlite code ", rc,
          "); free space (or quota) on the disk of --state-dir, or check that disk for errors"));
    default:
      return absl::InternalError(absl::StrCat("state database ", path, ": ", what, ": ", message,
                                              " (sqlite code ", rc, ")"));
  }
}

// Resets a statement at the end of a scope, so that none keeps a read
// transaction open (which would stop checkpoints from shrinking the WAL),
// and drops its bindings.
class StatementUse {
 public:
  explicit StatementUse(sqlite3_stmt* s) : s_(s) {}
  ~StatementUse() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  StatementUse(const StatementUse&) = delete;
  StatementUse& operator=(const StatementUse&) = delete;

 private:
  sqlite3_stmt* const s_;
};

// SQLITE_TRANSIENT copies: a value is at most kMaxValueBytes, and a Commit
// pays an fsync anyway. std::string::data() is never null, so an empty value
// binds as an empty blob, not as NULL.
int BindText(sqlite3_stmt* s, int index, const std::string& text) {
  return sqlite3_bind_text(s, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

int BindBlob(sqlite3_stmt* s, int index, const std::string& bytes) {
  return sqlite3_bind_blob(s, index, bytes.data(), static_cast<int>(bytes.size()),
                           SQLITE_TRANSIENT);
}

// A column's bytes (text or blob); "" for an empty blob, which SQLite
// returns as a null pointer.
std::string ColumnBytes(sqlite3_stmt* s, int column) {
  const void* data = sqlite3_column_blob(s, column);
  const int size = sqlite3_column_bytes(s, column);
  if (data == nullptr) return std::string();
  return std::string(static_cast<const char*>(data), static_cast<size_t>(size));
}

// A column's size in bytes, without copying it.
size_t ColumnSize(sqlite3_stmt* s, int column) {
  return static_cast<size_t>(std::max(0, sqlite3_column_bytes(s, column)));
}

// At most the first `bytes` of a column (for messages about it).
std::string ColumnPrefix(sqlite3_stmt* s, int column, size_t bytes) {
  const void* data = sqlite3_column_blob(s, column);
  if (data == nullptr) return std::string();
  return std::string(static_cast<const char*>(data), std::min(bytes, ColumnSize(s, column)));
}

// Steps a statement that returns no rows to completion.
absl::Status Run(sqlite3* db, const std::string& path, sqlite3_stmt* s, absl::string_view what) {
  const int rc = sqlite3_step(s);
  if (rc != SQLITE_DONE) return SqliteError(db, rc, path, what);
  return absl::OkStatus();
}

// The least string above every string that starts with `prefix`, or nullopt
// when there is none ("", or only 0xff bytes). [prefix, successor) is a
// range on the primary key; LIKE would read '%' and '_' in keys as wildcards.
std::optional<std::string> PrefixSuccessor(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::nullopt;
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

// ---------------------------------------------------------------------------
// Opening.

// fsync of a directory, so that an entry just created in it survives power
// loss (SQLite syncs its own files, not the directories above them).
absl::Status SyncDir(const std::string& dir) {
  ScopedFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open directory", dir);
  if (fsync(fd.get()) != 0) return ErrnoError(errno, "cannot fsync directory", dir);
  return absl::OkStatus();
}

std::string ParentDir(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status CreateStateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) == 0) return SyncDir(ParentDir(dir));
  if (errno != EEXIST) return ErrnoError(errno, "cannot create state dir", dir);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat state dir", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state dir ", dir, " exists and is not a directory; fix --state-dir"));
  }
  return absl::OkStatus();
}

// The pid the lock holder wrote, or "unknown" (it may not have written it
// yet, or the file came from elsewhere).
std::string LockOwner(int fd) {
  char buffer[32];
  const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
  int pid = 0;
  if (n <= 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buffer, n)), &pid)) {
    return "unknown";
  }
  return absl::StrCat(pid);
}

// Takes the state dir's lock: an flock, which the kernel drops when this
// process dies, so no stale lock outlives a crash. Must come before the
// database is opened, because a second open()/close() of the database file
// in this process would drop the first connection's POSIX locks.
absl::StatusOr<ScopedFd> LockStateDir(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", SqliteStore::kLockFileName);
  ScopedFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open lock file", path);
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoError(errno, "cannot lock", path);
    return absl::FailedPreconditionError(absl::StrCat(
        "state dir ", dir, " is in use by another coordinator (pid ", LockOwner(fd.get()),
        "); stop that one, or give this one another --state-dir"));
  }
  // The pid is for the message above only; the flock is the lock.
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd.get(), 0) != 0 ||
      pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return ErrnoError(errno, "cannot write pid to lock file", path);
  }
  return fd;
}

absl::StatusOr<Statement> Prepare(sqlite3* db, const std::string& path, const char* sql,
                                  unsigned int flags) {
  sqlite3_stmt* s = nullptr;
  const int rc = sqlite3_prepare_v3(db, sql, -1, flags, &s, nullptr);
  Statement statement(s);
  if (rc != SQLITE_OK) return SqliteError(db, rc, path, sql);
  return statement;
}

absl::Status Exec(sqlite3* db, const std::string& path, const std::string& sql) {
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, rc, path, sql);
  return absl::OkStatus();
}

// The first column of the first row of `sql`, or nullopt when it has none.
absl::StatusOr<std::optional<std::string>> QueryOne(sqlite3* db, const std::string& path,
                                                    const char* sql) {
  ASSIGN_OR_RETURN(Statement s, Prepare(db, path, sql, 0));
  const int rc = sqlite3_step(s.get());
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  if (rc != SQLITE_ROW) return SqliteError(db, rc, path, sql);
  return std::optional<std::string>(ColumnBytes(s.get(), 0));
}

// Removes `path` if it exists.
absl::Status RemoveIfPresent(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "cannot remove", path);
  }
  return absl::OkStatus();
}

// The tables of a new database, and its schema version.
absl::Status CreateTables(sqlite3* db, const std::string& path) {
  return Exec(db, path,
              absl::StrCat("CREATE TABLE schema_version (id INTEGER PRIMARY KEY CHECK (id = 1), "
                           "version INTEGER NOT NULL);"
                           "INSERT INTO schema_version (id, version) VALUES (1, ",
                           SqliteStore::kSchemaVersion,
                           ");"
                           "CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, "
                           "value BLOB NOT NULL) WITHOUT ROWID;"));
}

// Builds an empty database with its tables under a temporary name,
// `path` + kNewDatabaseSuffix, and renames it to `path`. So `path` exists
// only ever with its tables, and an existing file without them has lost its
// state (CheckSchema). A crash while a new state dir is being set up leaves
// at most the temporary file (and its rollback journal), which the next Open
// removes and builds again; creating `path` itself first would leave a
// table-less database that every later start refused as DATA_LOSS.
// The caller holds the state dir's lock, so no other Open builds at once.
absl::Status CreateDatabase(const std::string& dir, const std::string& path) {
  const std::string building = absl::StrCat(path, SqliteStore::kNewDatabaseSuffix);
  RETURN_IF_ERROR(RemoveIfPresent(building));
  RETURN_IF_ERROR(RemoveIfPresent(absl::StrCat(building, "-journal")));
  {
    // Created here for its mode: SQLite would use 0644 (less the umask). It
    // gives its -wal and -shm files the database's mode, which the rename
    // keeps. Closed before SQLite opens the file (see LockStateDir).
    ScopedFd file(open(building.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (file.get() < 0) return ErrnoError(errno, "cannot create database", building);
  }
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(building.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
                           nullptr);
  Connection db(raw);
  if (rc != SQLITE_OK) return SqliteError(db.get(), rc, building, "open");
  // SQLite's default rollback journal, which leaves no file behind once
  // the transaction commits: the database file alone is then whole, and
  // safe to rename. The real open switches it to WAL.
  RETURN_IF_ERROR(Exec(db.get(), building, "PRAGMA synchronous=FULL"));
  RETURN_IF_ERROR(Exec(db.get(), building, "BEGIN IMMEDIATE"));
  absl::Status status = CreateTables(db.get(), building);
  if (status.ok()) status = Exec(db.get(), building, "COMMIT");
  if (!status.ok()) return status;  // Closing the connection rolls back.
  rc = sqlite3_close(db.release());
  if (rc != SQLITE_OK) return SqliteError(nullptr, rc, building, "close");
  if (rename(building.c_str(), path.c_str()) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot rename ", building, " to"), path);
  }
  return SyncDir(dir);
}

// Opens the database, first building it if its file is missing.
absl::StatusOr<Connection> OpenDatabase(const std::string& dir, const std::string& path) {
  {
    // Checked for itself (and for a symlink): SQLite would create a missing
    // file. Closed before SQLite opens the file (see LockStateDir).
    ScopedFd file(open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (file.get() < 0 && errno == ENOENT) {
      // A -wal (and -shm) left by the database that was here, moved aside
      // after a crash: SQLite opens a -wal it finds beside any database that
      // has pages and replays its frames (nothing in a WAL names its
      // database), so the new database would take the old one's records, or
      // pages of them. Without their database they hold nothing usable.
      RETURN_IF_ERROR(RemoveIfPresent(absl::StrCat(path, "-wal")));
      RETURN_IF_ERROR(RemoveIfPresent(absl::StrCat(path, "-shm")));
      RETURN_IF_ERROR(CreateDatabase(dir, path));
      file = ScopedFd(open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    }
    if (file.get() < 0) return ErrnoError(errno, "cannot open database", path);
  }
  sqlite3* raw = nullptr;
  // NOMUTEX: SqliteStore::mu_ serialises every use of the connection.
  const int rc = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
      nullptr);
  Connection db(raw);  // Allocated even when the open fails.
  if (rc != SQLITE_OK) return SqliteError(db.get(), rc, path, "open");
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  // The first statement that reads the file: a corrupt one fails here.
  ASSIGN_OR_RETURN(std::optional<std::string> mode,
                   QueryOne(db.get(), path, "PRAGMA journal_mode=WAL"));
  if (mode != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat("state database ", path, " cannot use SQLite's WAL journal (journal mode is ",
                     mode.value_or("unknown"), "); put --state-dir on a local filesystem"));
  }
  // Per connection, not stored in the file: with WAL, FULL fsyncs the WAL at
  // every commit, which makes commits durable on power loss.
  RETURN_IF_ERROR(Exec(db.get(), path, "PRAGMA synchronous=FULL"));
  // Copy each commit into the database file at once (a passive checkpoint
  // after every commit, the file fsynced): the .db file alone then holds
  // the state, so a backup that copies it without its -wal, or a WAL lost
  // after a crash, loses at most the commit in flight rather than everything
  // since the last checkpoint (SQLite's default waits for 1000 pages, which
  // this store's few commits a second take hours to fill). Costs one more
  // fsync per commit.
  RETURN_IF_ERROR(Exec(db.get(), path, "PRAGMA wal_autocheckpoint=1"));
  return db;
}

// Checks the schema version of the database (CreateDatabase made its
// tables). Runs inside a transaction.
absl::Status CheckSchema(sqlite3* db, const std::string& path) {
  ASSIGN_OR_RETURN(std::optional<std::string> exists,
                   QueryOne(db, path,
                            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                            "name = 'schema_version'"));
  // The tables are in the file before it gets its name (CreateDatabase), so
  // a file without them lost its state, e.g. it was truncated; it would
  // otherwise come back as an empty state, silently.
  if (!exists.has_value()) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path,
        " exists but holds no tables: its state is lost (was its -wal "
        "file deleted, or the file truncated or copied without it?); restore the state dir from "
        "a backup, or, if this state dir never held state, remove the file to start empty"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> text,
                   QueryOne(db, path, "SELECT version FROM schema_version WHERE id = 1"));
  int version = 0;
  if (!text.has_value() || !absl::SimpleAtoi(*text, &version) || version < 1) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path, " has no valid schema version (",
        text.has_value() ? absl::StrCat("\"", *text, "\"") : "no row",
        "); restore it from a backup, or move it aside to start with empty state (its -wal "
        "and -shm files with it: a -wal belongs to its database alone)"));
  }
  if (version > SqliteStore::kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state database ", path, " has schema version ", version, ", newer than schema version ",
        SqliteStore::kSchemaVersion,
        " of this coordinator; run a coordinator at least as new as the one that wrote it"));
  }
  // Older versions would be migrated here, one version at a time, in this
  // transaction. Version 1 is the first, so there are none yet.
  return absl::OkStatus();
}

absl::Status EnsureSchema(sqlite3* db, const std::string& path) {
  RETURN_IF_ERROR(Exec(db, path, "BEGIN IMMEDIATE"));
  absl::Status status = CheckSchema(db, path);
  if (status.ok()) status = Exec(db, path, "COMMIT");
  if (!status.ok() && sqlite3_get_autocommit(db) == 0) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  return status;
}

}  // namespace

struct SqliteStore::Statements {
  Statement begin, commit, rollback, get, put, erase, erase_range, erase_from, scan_range,
      scan_from;
};

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& state_dir) {
  if (state_dir.empty()) return absl::InvalidArgumentError("state dir is empty");
  RETURN_IF_ERROR(CreateStateDir(state_dir));
  ASSIGN_OR_RETURN(ScopedFd lock, LockStateDir(state_dir));
  const std::string path = absl::StrCat(state_dir, "/", kDatabaseFileName);
  ASSIGN_OR_RETURN(Connection db, OpenDatabase(state_dir, path));
  RETURN_IF_ERROR(EnsureSchema(db.get(), path));
  // A coordinator killed with -9 between a commit and its checkpoint left
  // that commit in the WAL alone; move it into the database file now (a
  // clean close does the same). Best effort: SQLite reads the WAL, so the
  // state is whole without it, and on a full disk, where the .db cannot
  // grow, reads and the commits the WAL has room for still work. Refusing
  // to start there made a crash loop, with no status, cancel or sweep
  // (whose expiries free space) until someone freed space by hand. A
  // corrupt file is still refused, as at every other step.
  if (absl::Status checkpointed = Exec(db.get(), path, "PRAGMA wal_checkpoint(TRUNCATE)");
      !checkpointed.ok()) {
    if (absl::IsDataLoss(checkpointed)) return checkpointed;
    PT_LOG(WARNING) << "--state-dir " << state_dir << ": could not checkpoint the WAL ("
                    << checkpointed.message() << "); going on (SQLite reads its commits from "
                    << "the WAL)";
  }

  auto statements = std::make_unique<Statements>();
  const std::pair<Statement*, const char*> sql[] = {
      {&statements->begin, "BEGIN IMMEDIATE"},
      {&statements->commit, "COMMIT"},
      {&statements->rollback, "ROLLBACK"},
      {&statements->get, "SELECT value FROM kv WHERE key = ?1"},
      {&statements->put, "INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)"},
      {&statements->erase, "DELETE FROM kv WHERE key = ?1"},
      {&statements->erase_range, "DELETE FROM kv WHERE key >= ?1 AND key < ?2"},
      {&statements->erase_from, "DELETE FROM kv WHERE key >= ?1"},
      {&statements->scan_range,
       "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key"},
      {&statements->scan_from, "SELECT key, value FROM kv WHERE key >= ?1 ORDER BY key"},
  };
  for (const auto& [target, text] : sql) {
    ASSIGN_OR_RETURN(*target, Prepare(db.get(), path, text, SQLITE_PREPARE_PERSISTENT));
  }
  return std::unique_ptr<SqliteStore>(
      new SqliteStore(path, std::move(lock), db.release(), std::move(statements)));
}

SqliteStore::SqliteStore(std::string db_path, ScopedFd lock, sqlite3* db,
                         std::unique_ptr<Statements> statements)
    : db_path_(std::move(db_path)),
      lock_(std::move(lock)),
      db_(db),
      statements_(std::move(statements)) {}

SqliteStore::~SqliteStore() {
  statements_.reset();
  // Checkpoints the WAL into the database. lock_ is released after this.
  sqlite3_close_v2(db_);
}

absl::Status SqliteStore::Commit(const std::vector<StoreWrite>& writes) {
  RETURN_IF_ERROR(CheckStoreWrites(writes));
  if (writes.empty()) return absl::OkStatus();
  AnnotatedMutexLock lock(&mu_);
  {
    StatementUse use(statements_->begin.get());
    RETURN_IF_ERROR(Run(db_, db_path_, statements_->begin.get(), "BEGIN IMMEDIATE"));
  }
  absl::Status status;
  for (const StoreWrite& w : writes) {
    status = ApplyLocked(w);
    if (!status.ok()) break;
  }
  if (status.ok()) {
    StatementUse use(statements_->commit.get());
    status = Run(db_, db_path_, statements_->commit.get(), "COMMIT");
  }
  // A failed write, or a COMMIT that failed without ending the transaction.
  if (!status.ok() && sqlite3_get_autocommit(db_) == 0) {
    StatementUse use(statements_->rollback.get());
    sqlite3_step(statements_->rollback.get());
  }
  return status;
}

absl::Status SqliteStore::ApplyLocked(const StoreWrite& w) {
  sqlite3_stmt* s = nullptr;
  std::optional<std::string> end;
  switch (w.kind) {
    case StoreWrite::Kind::kPut:
      s = statements_->put.get();
      break;
    case StoreWrite::Kind::kDelete:
      s = statements_->erase.get();
      break;
    case StoreWrite::Kind::kDeletePrefix:
      end = PrefixSuccessor(w.key);
      s = end.has_value() ? statements_->erase_range.get() : statements_->erase_from.get();
      break;
  }
  StatementUse use(s);
  int rc = BindText(s, 1, w.key);
  if (rc == SQLITE_OK && w.kind == StoreWrite::Kind::kPut) rc = BindBlob(s, 2, w.value);
  if (rc == SQLITE_OK && end.has_value()) rc = BindText(s, 2, *end);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, db_path_, absl::StrCat("bind key ", w.key));
  return Run(db_, db_path_, s, absl::StrCat("write key ", w.key));
}

absl::StatusOr<std::optional<std::string>> SqliteStore::Get(const std::string& key) const {
  RETURN_IF_ERROR(CheckStoreKey(key));
  AnnotatedMutexLock lock(&mu_);
  sqlite3_stmt* s = statements_->get.get();
  StatementUse use(s);
  const int bound = BindText(s, 1, key);
  if (bound != SQLITE_OK) return SqliteError(db_, bound, db_path_, absl::StrCat("bind key ", key));
  const int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  if (rc != SQLITE_ROW) return SqliteError(db_, rc, db_path_, absl::StrCat("read key ", key));
  RETURN_IF_ERROR(CheckStoredEntry(Describe(), key, ColumnSize(s, 0)));
  return std::optional<std::string>(ColumnBytes(s, 0));
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SqliteStore::Scan(
    const std::string& prefix) const {
  if (!prefix.empty()) RETURN_IF_ERROR(CheckStoreKey(prefix));
  const std::optional<std::string> end = PrefixSuccessor(prefix);
  AnnotatedMutexLock lock(&mu_);
  sqlite3_stmt* s = end.has_value() ? statements_->scan_range.get() : statements_->scan_from.get();
  StatementUse use(s);
  int rc = BindText(s, 1, prefix);
  if (rc == SQLITE_OK && end.has_value()) rc = BindText(s, 2, *end);
  if (rc != SQLITE_OK) {
    return SqliteError(db_, rc, db_path_, absl::StrCat("bind prefix ", prefix));
  }
  std::vector<std::pair<std::string, std::string>> found;
  const std::string where = Describe();
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    // Checked before the value is copied: at most one byte past a key's
    // bound is, so that an over-long key is still refused.
    std::string key = ColumnPrefix(s, 0, kMaxKeyBytes + 1);
    RETURN_IF_ERROR(CheckStoredEntry(where, key, ColumnSize(s, 1)));
    found.emplace_back(std::move(key), ColumnBytes(s, 1));
  }
  if (rc != SQLITE_DONE) {
    return SqliteError(db_, rc, db_path_, absl::StrCat("scan prefix ", prefix));
  }
  return found;
}

std::string SqliteStore::Describe() const { return absl::StrCat("sqlite:", db_path_); }

}  // namespace pipetrain
