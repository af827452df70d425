// SqliteStore on a --state-dir disk that refuses writes: a wrapping SQLite
// VFS, registered as the default for this binary, fails the writes a test
// picks as a full disk (SQLITE_FULL) or an exceeded quota (SQLITE_IOERR)
// would.
#include "coordinator/store/sqlite_store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// What the wrapping VFS's writes answer: SQLITE_OK passes them on, any other
// code fails them. The main database file's and the other files' (-wal,
// journals) apart: a disk with no room for the .db to grow may still take
// writes to the WAL's pages.
std::atomic<int> g_database_write_result{SQLITE_OK};
std::atomic<int> g_other_write_result{SQLITE_OK};

sqlite3_vfs* g_base_vfs = nullptr;

// A file of the wrapping VFS: the base VFS's file follows it in the same
// allocation (szOsFile).
struct FailingFile {
  sqlite3_file base;
  sqlite3_file* real;
  bool main_database;
};

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<FailingFile*>(f)->real; }

int Close(sqlite3_file* f) { return Real(f)->pMethods->xClose(Real(f)); }
int Read(sqlite3_file* f, void* data, int n, sqlite3_int64 offset) {
  return Real(f)->pMethods->xRead(Real(f), data, n, offset);
}
int Write(sqlite3_file* f, const void* data, int n, sqlite3_int64 offset) {
  const int result = reinterpret_cast<FailingFile*>(f)->main_database
                         ? g_database_write_result.load()
                         : g_other_write_result.load();
  if (result != SQLITE_OK) return result;
  return Real(f)->pMethods->xWrite(Real(f), data, n, offset);
}
int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  return Real(f)->pMethods->xTruncate(Real(f), size);
}
int Sync(sqlite3_file* f, int flags) { return Real(f)->pMethods->xSync(Real(f), flags); }
int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  return Real(f)->pMethods->xFileSize(Real(f), size);
}
int Lock(sqlite3_file* f, int level) { return Real(f)->pMethods->xLock(Real(f), level); }
int Unlock(sqlite3_file* f, int level) { return Real(f)->pMethods->xUnlock(Real(f), level); }
int CheckReservedLock(sqlite3_file* f, int* out) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int SectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int DeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int ShmMap(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
  return Real(f)->pMethods->xShmMap(Real(f), region, size, extend, out);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int ShmUnmap(sqlite3_file* f, int delete_flag) {
  return Real(f)->pMethods->xShmUnmap(Real(f), delete_flag);
}
int Fetch(sqlite3_file* f, sqlite3_int64 offset, int n, void** out) {
  return Real(f)->pMethods->xFetch(Real(f), offset, n, out);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 offset, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), offset, p);
}

// Version 3, as the unix VFS's files: WAL needs the shared-memory methods.
const sqlite3_io_methods kFailingIo = {
    3,
    Close,
    Read,
    Write,
    Truncate,
    Sync,
    FileSize,
    Lock,
    Unlock,
    CheckReservedLock,
    FileControl,
    SectorSize,
    DeviceCharacteristics,
    ShmMap,
    ShmLock,
    ShmBarrier,
    ShmUnmap,
    Fetch,
    Unfetch,
};

int Open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  auto* file = reinterpret_cast<FailingFile*>(f);
  file->real = reinterpret_cast<sqlite3_file*>(file + 1);
  file->main_database = (flags & SQLITE_OPEN_MAIN_DB) != 0;
  const int rc = g_base_vfs->xOpen(g_base_vfs, name, file->real, flags, out_flags);
  // SQLite calls xClose exactly when pMethods is set.
  file->base.pMethods = file->real->pMethods != nullptr ? &kFailingIo : nullptr;
  return rc;
}

class SqliteStoreFailingDiskTest : public ::testing::Test {
 protected:
  // A copy of the default VFS but for xOpen and its files: SQLite's own unix
  // VFSes ("unix", "unix-dotfile", ...) share every other method and differ
  // in pAppData, which the copy keeps, so those methods take the copy.
  static void SetUpTestSuite() {
    g_base_vfs = sqlite3_vfs_find(nullptr);
    ASSERT_NE(g_base_vfs, nullptr);
    static sqlite3_vfs failing;
    failing = *g_base_vfs;
    failing.zName = "pipetrain-failing-disk";
    failing.szOsFile = static_cast<int>(sizeof(FailingFile)) + g_base_vfs->szOsFile;
    failing.xOpen = Open;
    failing.pNext = nullptr;
    ASSERT_EQ(sqlite3_vfs_register(&failing, /*makeDflt=*/1), SQLITE_OK);
  }
  static void TearDownTestSuite() {
    sqlite3_vfs_unregister(sqlite3_vfs_find("pipetrain-failing-disk"));
  }
  void TearDown() override {
    g_database_write_result = SQLITE_OK;
    g_other_write_result = SQLITE_OK;
  }

  // A fresh directory under TEST_TMPDIR; the state dir is "state" inside it.
  static std::string NewStateDir() {
    std::string templ = absl::StrCat(getenv("TEST_TMPDIR"), "/storeXXXXXX");
    EXPECT_NE(mkdtemp(templ.data()), nullptr) << templ;
    return templ + "/state";
  }

  static std::unique_ptr<SqliteStore> MustOpen(const std::string& dir) {
    absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  static off_t FileSizeOf(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
  }
};

// The .db cannot grow (the disk is full), so a commit stays in the WAL: its
// checkpoint, and the one of a clean close, fail. The next start's
// checkpoint fails too; it used to end Open with INTERNAL, and the
// coordinator exited at every start. Now Open goes on, reads the commits
// from the WAL and takes more.
TEST_F(SqliteStoreFailingDiskTest, Open_DatabaseFileCannotGrow_OpensAndReadsTheWal) {
  const std::string dir = NewStateDir();
  std::unique_ptr<SqliteStore> store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Commit({StoreWrite::Put("jobs/a", "1")}).ok());
  g_database_write_result = SQLITE_FULL;
  ASSERT_TRUE(store->Commit({StoreWrite::Put("jobs/b", "2")}).ok());
  store.reset();
  ASSERT_GT(FileSizeOf(dir + "/coordinator.db-wal"), 0) << "the commit should stay in the WAL";

  store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"jobs/a", "1"}, {"jobs/b", "2"}}) {
    absl::StatusOr<std::optional<std::string>> got = store->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, value) << key;
  }
  EXPECT_TRUE(store->Commit({StoreWrite::Put("jobs/c", "3")}).ok());

  // Space freed: the next start checkpoints everything into the .db, and
  // truncates the WAL.
  store.reset();
  g_database_write_result = SQLITE_OK;
  store = MustOpen(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(FileSizeOf(dir + "/coordinator.db-wal"), 0);
  absl::StatusOr<std::optional<std::string>> got = store->Get("jobs/c");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "3");
}

// A commit the disk has no room for says where to free space.
TEST_F(SqliteStoreFailingDiskTest, Commit_DiskFull_InternalNamingStateDirSpace) {
  std::unique_ptr<SqliteStore> store = MustOpen(NewStateDir());
  ASSERT_NE(store, nullptr);
  g_database_write_result = SQLITE_FULL;
  g_other_write_result = SQLITE_FULL;
  absl::Status status = store->Commit({StoreWrite::Put("jobs/a", "1")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("database or disk is full"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("free space (or quota) on the disk of --state-dir"));
}

// An exceeded quota reaches SQLite as EDQUOT, which it reports only as a
// "disk I/O error": the message still says to free space or quota.
TEST_F(SqliteStoreFailingDiskTest, Commit_QuotaExceeded_InternalNamingStateDirSpace) {
  std::unique_ptr<SqliteStore> store = MustOpen(NewStateDir());
  ASSERT_NE(store, nullptr);
  g_database_write_result = SQLITE_IOERR_WRITE;
  g_other_write_result = SQLITE_IOERR_WRITE;
  absl::Status status = store->Commit({StoreWrite::Put("jobs/a", "1")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("disk I/O error"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("free space (or quota) on the disk of --state-dir"));
}

}  // namespace
}  // namespace pipetrain
