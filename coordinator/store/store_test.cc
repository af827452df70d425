// Every backend against the Store contract (store.h, its cases in
// store_contract_testing.cc), then SqliteStore's own
// behaviour: files and modes, reopening, the state dir lock, the schema
// version and corrupt files.
#include "coordinator/store/store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/sqlite_store.h"
#include "coordinator/store/store_contract_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using KeyValues = std::vector<std::pair<std::string, std::string>>;

// A fresh directory under TEST_TMPDIR; the state dir is "state" inside it, so
// that Open has to create it.
std::string NewStateDir() {
  std::string templ = absl::StrCat(getenv("TEST_TMPDIR"), "/storeXXXXXX");
  EXPECT_NE(mkdtemp(templ.data()), nullptr) << templ;
  return templ + "/state";
}

// The Store contract's cases (store_contract_testing.cc) on both backends,
// each case on a fresh store (SQLite: in a new state dir).
std::vector<StoreBackend> Backends() {
  return {
      {"Memory",
       []() -> absl::StatusOr<std::unique_ptr<Store>> { return std::make_unique<MemoryStore>(); }},
      {"Sqlite",
       []() -> absl::StatusOr<std::unique_ptr<Store>> {
         absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(NewStateDir());
         if (!store.ok()) return store.status();
         return std::unique_ptr<Store>(std::move(*store));
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreContractTest, ::testing::ValuesIn(Backends()),
                         StoreBackendName);

TEST(MemoryStoreTest, Describe_SaysMemory) { EXPECT_EQ(MemoryStore().Describe(), "memory"); }

// ---------------------------------------------------------------------------
// SqliteStore only.

std::unique_ptr<SqliteStore> MustOpen(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

mode_t Permissions(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Runs `sql` on the database with SQLite directly, as an operator would.
void ExecRaw(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
}

TEST(SqliteStoreTest, Open_NewDir_CreatesPrivateDirAndFiles) {
  const std::string dir = NewStateDir();
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Permissions(dir), 0700u);
  EXPECT_EQ(Permissions(dir + "/coordinator.db"), 0600u);
  EXPECT_EQ(Permissions(dir + "/coordinator.lock"), 0600u);
  // SQLite creates the WAL and its index with the database's mode.
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
  EXPECT_EQ(Permissions(dir + "/coordinator.db-wal"), 0600u);
  EXPECT_EQ(Permissions(dir + "/coordinator.db-shm"), 0600u);
  EXPECT_EQ(ReadFile(dir + "/coordinator.lock"), absl::StrCat(getpid(), "\n"));
  EXPECT_EQ(store->Describe(), absl::StrCat("sqlite:", dir, "/coordinator.db"));
}

TEST(SqliteStoreTest, Open_EmptyPath_InvalidArgument) {
  EXPECT_EQ(SqliteStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SqliteStoreTest, Open_ParentMissing_NotFound) {
  const std::string dir = NewStateDir() + "/deeper";
  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(dir));
}

TEST(SqliteStoreTest, Open_PathIsAFile_FailedPrecondition) {
  const std::string dir = NewStateDir();
  std::ofstream(dir) << "not a directory";
  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(dir + " exists and is not a directory"));
}

TEST(SqliteStoreTest, Reopen_AfterCommits_FindsThem) {
  const std::string dir = NewStateDir();
  {
    std::unique_ptr<SqliteStore> store = MustOpen(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(store->Commit({StoreWrite::Put("jobs/a", "1"), StoreWrite::Put("jobs/b", "2"),
                             StoreWrite::Put("workers/w", "3")}),
              absl::OkStatus());
    ASSERT_EQ(store->Commit({StoreWrite::Delete("jobs/a"), StoreWrite::Put("jobs/b", "22")}),
              absl::OkStatus());
  }
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<KeyValues> all = store->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(Pair("jobs/b", "22"), Pair("workers/w", "3")));
}

// A coordinator killed with -9: a child process opens the store, commits
// and _exit()s without closing it, so its commit lives in the WAL alone.
void CommitAndDieWithoutClosing(const std::string& dir) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
    const bool ok = store.ok() && (*store)->Commit({StoreWrite::Put("jobs/a", "1")}).ok();
    _exit(ok ? 0 : 1);  // no destructor: nothing checkpointed
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Each commit reaches the database file at once, so a WAL lost after a
// crash (or a backup of the .db file alone) loses none of them.
TEST(SqliteStoreTest, Open_WalLostAfterACrash_KeepsEveryCommit) {
  const std::string dir = NewStateDir();
  CommitAndDieWithoutClosing(dir);
  const std::string db = dir + "/coordinator.db";
  ASSERT_GT(ReadFile(db + "-wal").size(), 0u) << "the crash should leave a WAL";
  ASSERT_EQ(unlink((db + "-wal").c_str()), 0);
  unlink((db + "-shm").c_str());
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<KeyValues> all = store->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(Pair("jobs/a", "1")));
}

// A database moved aside after a crash, as the DATA_LOSS messages advise,
// with its -wal and -shm left behind: the new database starts empty. SQLite
// replays a -wal it finds beside any database with pages, so without their
// removal the moved database's records came back in the new one.
TEST(SqliteStoreTest, Open_DatabaseMovedAsideWithoutItsWal_NewOneStartsEmpty) {
  const std::string dir = NewStateDir();
  CommitAndDieWithoutClosing(dir);
  const std::string db = dir + "/coordinator.db";
  ASSERT_GT(ReadFile(db + "-wal").size(), 0u) << "the crash should leave a WAL";
  ASSERT_EQ(rename(db.c_str(), (db + ".aside").c_str()), 0);
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<KeyValues> all = store->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->empty()) << all->size() << " records came back, the first "
                            << all->front().first;
}

// A database file truncated to nothing held state (it exists) but has no
// tables: the store says so instead of starting empty.
TEST(SqliteStoreTest, Open_EmptyExistingFile_DataLoss) {
  const std::string dir = NewStateDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/coordinator.db").close();
  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("holds no tables"));
}

// A crash while a new database was being built left its temporary file
// and a rollback journal: the next Open removes both and builds anew.
TEST(SqliteStoreTest, Open_LeftoverOfACrashedFirstOpen_BuildsTheDatabaseAnew) {
  const std::string dir = NewStateDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/coordinator.db.new") << std::string(4096, 'x');
  std::ofstream(dir + "/coordinator.db.new-journal") << std::string(512, 'j');
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<KeyValues> all = store->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->empty());
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
  struct stat st;
  EXPECT_NE(stat((dir + "/coordinator.db.new").c_str(), &st), 0);
  EXPECT_NE(stat((dir + "/coordinator.db.new-journal").c_str(), &st), 0);
  EXPECT_EQ(Permissions(dir + "/coordinator.db"), 0600u);
}

// After a crash and a reopen, the database file alone holds the commits:
// a copy of the .db file alone, taken while the store is open, has them.
TEST(SqliteStoreTest, Open_AfterACrash_TheDatabaseFileAloneHoldsTheCommits) {
  const std::string dir = NewStateDir();
  CommitAndDieWithoutClosing(dir);
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  const std::string copy = NewStateDir();
  ASSERT_EQ(mkdir(copy.c_str(), 0700), 0);
  std::ofstream(copy + "/coordinator.db", std::ios::binary) << ReadFile(dir + "/coordinator.db");
  std::unique_ptr<SqliteStore> copied = MustOpen(copy);
  ASSERT_NE(copied, nullptr);
  absl::StatusOr<KeyValues> all = copied->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(Pair("jobs/a", "1")));
}

TEST(SqliteStoreTest, Open_WhileOpen_FailedPreconditionUntilFirstIsGone) {
  const std::string dir = NewStateDir();
  std::unique_ptr<SqliteStore> first = MustOpen(dir);
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(first->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());

  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("state dir ", dir, " is in use by another coordinator (pid ",
                                     getpid(), ")")));
  // The refused open left the first store working.
  absl::StatusOr<std::optional<std::string>> value = first->Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  ASSERT_EQ(first->Commit({StoreWrite::Put("k2", "v2")}), absl::OkStatus());

  first.reset();
  std::unique_ptr<SqliteStore> second = MustOpen(dir);
  ASSERT_NE(second, nullptr);
  value = second->Get("k2");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v2");
}

TEST(SqliteStoreTest, Open_NewerSchemaVersion_FailedPreconditionNamingBoth) {
  const std::string dir = NewStateDir();
  ASSERT_NE(MustOpen(dir), nullptr);
  const std::string db = dir + "/coordinator.db";
  ExecRaw(db, "UPDATE schema_version SET version = 2");

  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("state database ", db,
                                     " has schema version 2, newer than schema version 1")));
  // Refused, not rewritten: still version 2, and the lock was released.
  status = SqliteStore::Open(dir).status();
  EXPECT_THAT(status.message(), HasSubstr("has schema version 2"));
}

// Entries no write makes (a value over kMaxValueBytes, a key with a control
// byte), put there by another program, are refused before they are
// copied: DATA_LOSS naming the store and the key.
TEST(SqliteStoreTest, GetAndScan_EntriesNoWriteMakes_DataLossNamingTheKey) {
  const std::string dir = NewStateDir();
  {
    std::unique_ptr<SqliteStore> store = MustOpen(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Commit({StoreWrite::Put("jobs/ok", "v")}).ok());
  }
  const std::string db = dir + "/coordinator.db";
  ExecRaw(db, "INSERT INTO kv (key, value) VALUES ('big/x', zeroblob(1048577))");
  ExecRaw(db, "INSERT INTO kv (key, value) VALUES ('bad/' || char(1), x'00')");
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  absl::Status big = store->Get("big/x").status();
  EXPECT_EQ(big.code(), absl::StatusCode::kDataLoss) << big;
  EXPECT_THAT(big.message(), HasSubstr("holds 1048577 bytes at key \"big/x\""));
  big = store->Scan("big/").status();
  EXPECT_EQ(big.code(), absl::StatusCode::kDataLoss) << big;
  const absl::Status bad = store->Scan("bad/").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("holds key \"bad/\\x01\""));
  EXPECT_TRUE(store->Scan("jobs/").ok());
}

TEST(SqliteStoreTest, Open_GarbageFile_DataLossNamingPath) {
  const std::string dir = NewStateDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string db = dir + "/coordinator.db";
  std::ofstream(db) << std::string(8192, 'x');
  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("state database ", db, " is corrupt")));
}

TEST(SqliteStoreTest, Open_OverwrittenHeader_DataLossNamingPath) {
  const std::string dir = NewStateDir();
  {
    std::unique_ptr<SqliteStore> store = MustOpen(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(store->Commit({StoreWrite::Put("k", std::string(10000, 'v'))}), absl::OkStatus());
  }
  const std::string db = dir + "/coordinator.db";
  {
    std::fstream file(db, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(0);
    file << "this is no header";  // Over "SQLite format 3\0".
  }
  absl::Status status = SqliteStore::Open(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("state database ", db, " is corrupt")));
}

}  // namespace
}  // namespace pipetrain
