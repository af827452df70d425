// Every backend against the Store contract (store.h), then SqliteStore's own
// behaviour: files and modes, reopening, the state dir lock, the schema
// version and corrupt files.
#include "coordinator/store/store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/sqlite_store.h"
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

struct Backend {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Store>>(const std::string& state_dir)> open;
};

// Failure messages name the backend rather than dumping its bytes.
void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.name; }

std::vector<Backend> Backends() {
  return {
      {"Memory",
       [](const std::string&) -> absl::StatusOr<std::unique_ptr<Store>> {
         return std::make_unique<MemoryStore>();
       }},
      {"Sqlite",
       [](const std::string& dir) -> absl::StatusOr<std::unique_ptr<Store>> {
         absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(dir);
         if (!store.ok()) return store.status();
         return std::unique_ptr<Store>(std::move(*store));
       }},
  };
}

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Store>> store = GetParam().open(NewStateDir());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  void MustCommit(const std::vector<StoreWrite>& writes) {
    absl::Status status = store_->Commit(writes);
    ASSERT_TRUE(status.ok()) << status;
  }

  std::optional<std::string> MustGet(const std::string& key) {
    absl::StatusOr<std::optional<std::string>> value = store_->Get(key);
    EXPECT_TRUE(value.ok()) << value.status();
    return value.ok() ? *value : std::nullopt;
  }

  KeyValues MustScan(const std::string& prefix) {
    absl::StatusOr<KeyValues> found = store_->Scan(prefix);
    EXPECT_TRUE(found.ok()) << found.status();
    return found.ok() ? *found : KeyValues();
  }

  std::vector<std::string> Keys(const std::string& prefix) {
    std::vector<std::string> keys;
    for (const auto& kv : MustScan(prefix)) keys.push_back(kv.first);
    return keys;
  }

  // Puts each key with its own name as the value.
  void PutAll(const std::vector<std::string>& keys) {
    std::vector<StoreWrite> writes;
    for (const std::string& key : keys) writes.push_back(StoreWrite::Put(key, key));
    MustCommit(writes);
  }

  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, Get_MissingKey_ReturnsNullopt) { EXPECT_EQ(MustGet("jobs/none"), std::nullopt); }

TEST_P(StoreTest, Commit_Put_GetReturnsValue) {
  const std::string binary("\0\x01\xff\x80 z", 6);
  MustCommit({StoreWrite::Put("jobs/a", "alpha"), StoreWrite::Put("jobs/bin", binary),
              StoreWrite::Put("jobs/empty", "")});
  EXPECT_EQ(MustGet("jobs/a"), "alpha");
  EXPECT_EQ(MustGet("jobs/bin"), binary);
  EXPECT_EQ(MustGet("jobs/empty"), std::string());  // Present, not nullopt.
}

TEST_P(StoreTest, Commit_PutExistingKey_Overwrites) {
  MustCommit({StoreWrite::Put("k", "one")});
  MustCommit({StoreWrite::Put("k", "two")});
  EXPECT_EQ(MustGet("k"), "two");
  EXPECT_THAT(MustScan("k"), ElementsAre(Pair("k", "two")));
}

TEST_P(StoreTest, Commit_Delete_RemovesOnlyThatKey) {
  PutAll({"a", "a/b", "b"});
  MustCommit({StoreWrite::Delete("a"), StoreWrite::Delete("missing")});
  EXPECT_EQ(MustGet("a"), std::nullopt);
  EXPECT_THAT(Keys(""), ElementsAre("a/b", "b"));
}

TEST_P(StoreTest, Commit_MixedBatch_AppliesInOrder) {
  PutAll({"c/old"});
  MustCommit({StoreWrite::Put("a", "1"), StoreWrite::Delete("a"), StoreWrite::Put("b", "1"),
              StoreWrite::Put("b", "2"), StoreWrite::DeletePrefix("c/"),
              StoreWrite::Put("c/new", "3")});
  EXPECT_THAT(MustScan(""), ElementsAre(Pair("b", "2"), Pair("c/new", "3")));
}

TEST_P(StoreTest, Commit_EmptyBatch_Ok) {
  MustCommit({});
  EXPECT_THAT(MustScan(""), ElementsAre());
}

TEST_P(StoreTest, Commit_DeletePrefixWithWildcardCharacters_DeletesOnlyLiteralPrefix) {
  // LIKE would read '%' as "anything" and '_' as "any one character".
  PutAll({"a%", "a%b/1", "a%c", "aXb/1", "a_", "a_b", "abb", "a"});
  MustCommit({StoreWrite::DeletePrefix("a%")});
  EXPECT_THAT(Keys(""), ElementsAre("a", "aXb/1", "a_", "a_b", "abb"));
  MustCommit({StoreWrite::DeletePrefix("a_")});
  EXPECT_THAT(Keys(""), ElementsAre("a", "aXb/1", "abb"));
}

TEST_P(StoreTest, Commit_DeletePrefixEndingInTilde_DeletesEveryKeyUnderIt) {
  // '~' (0x7e) is the last printable byte: the prefix's successor is "x\x7f".
  PutAll({"x", "x}", "x~", "x~a", "x~~", "x~~~", "y", "~", "~~", "}"});
  MustCommit({StoreWrite::DeletePrefix("x~")});
  EXPECT_THAT(Keys(""), ElementsAre("x", "x}", "y", "}", "~", "~~"));
  MustCommit({StoreWrite::DeletePrefix("~")});
  EXPECT_THAT(Keys(""), ElementsAre("x", "x}", "y", "}"));
}

TEST_P(StoreTest, Commit_DeletePrefix_LeavesNeighboursAlone) {
  PutAll({"a", "aa~", "ab", "ab/1", "ab~", "abc", "ac", "b"});
  MustCommit({StoreWrite::DeletePrefix("ab")});
  EXPECT_THAT(Keys(""), ElementsAre("a", "aa~", "ac", "b"));
}

TEST_P(StoreTest, Scan_Prefix_AscendingByteOrderAndOnlyThePrefix) {
  PutAll({"jobs/b", "jobs/a~", "jobs/A", "jobs/a", "jobs/ a", "jobs", "jobs0", "job", "workers/1"});
  EXPECT_THAT(Keys("jobs/"), ElementsAre("jobs/ a", "jobs/A", "jobs/a", "jobs/a~", "jobs/b"));
  EXPECT_THAT(Keys("jobs"),
              ElementsAre("jobs", "jobs/ a", "jobs/A", "jobs/a", "jobs/a~", "jobs/b", "jobs0"));
  EXPECT_THAT(Keys("jobs/a"), ElementsAre("jobs/a", "jobs/a~"));
  EXPECT_THAT(Keys("nothing"), ElementsAre());
  EXPECT_THAT(MustScan("workers/"), ElementsAre(Pair("workers/1", "workers/1")));
}

TEST_P(StoreTest, Scan_EmptyPrefix_ReturnsEveryKey) {
  PutAll({"b", "a", "~", " "});
  EXPECT_THAT(Keys(""), ElementsAre(" ", "a", "b", "~"));
}

TEST_P(StoreTest, Scan_WildcardOrTildePrefix_IsLiteral) {
  PutAll({"a%", "a%1", "ab", "a_", "a_1", "a~", "a~~", "b"});
  EXPECT_THAT(Keys("a%"), ElementsAre("a%", "a%1"));
  EXPECT_THAT(Keys("a_"), ElementsAre("a_", "a_1"));
  EXPECT_THAT(Keys("a~"), ElementsAre("a~", "a~~"));
}

TEST_P(StoreTest, Commit_InvalidKeyMidBatch_ChangesNothing) {
  PutAll({"keep"});
  absl::Status status =
      store_->Commit({StoreWrite::Put("new", "1"), StoreWrite::Delete("keep"),
                      StoreWrite::Put("bad\nkey", "2"), StoreWrite::Put("later", "3")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("write #2"));
  EXPECT_THAT(status.message(), HasSubstr("0x0a at offset 3"));
  EXPECT_THAT(Keys(""), ElementsAre("keep"));
}

TEST_P(StoreTest, Commit_OversizedValueMidBatch_ChangesNothing) {
  absl::Status status =
      store_->Commit({StoreWrite::Put("a", "1"), StoreWrite::DeletePrefix("a"),
                      StoreWrite::Put("big", std::string(kMaxValueBytes + 1, 'v'))});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("write #2: value of key big is ", kMaxValueBytes + 1,
                                     " bytes; the limit is ", kMaxValueBytes)));
  EXPECT_THAT(Keys(""), ElementsAre());
}

TEST_P(StoreTest, Commit_KeyAndValueAtTheLimits_RoundTrip) {
  const std::string key(kMaxKeyBytes, 'k');
  const std::string value(kMaxValueBytes, '\xab');
  MustCommit({StoreWrite::Put(key, value)});
  EXPECT_EQ(MustGet(key), value);
}

TEST_P(StoreTest, Commit_BadKeys_InvalidArgument) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "store key is empty"},
      {std::string(kMaxKeyBytes + 1, 'k'),
       absl::StrCat("is ", kMaxKeyBytes + 1, " bytes; the limit is ", kMaxKeyBytes)},
      {std::string("a\0b", 3), "byte 0x00 at offset 1"},
      {"tab\t", "byte 0x09 at offset 3"},
      {"del\x7f", "byte 0x7f at offset 3"},
      {"\x80high", "byte 0x80 at offset 0"},
  };
  for (const auto& [key, message] : cases) {
    for (const StoreWrite& write :
         {StoreWrite::Put(key, "v"), StoreWrite::Delete(key), StoreWrite::DeletePrefix(key)}) {
      absl::Status status = store_->Commit({write});
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
      EXPECT_THAT(status.message(), HasSubstr(message));
    }
    EXPECT_EQ(store_->Get(key).status().code(), absl::StatusCode::kInvalidArgument) << message;
    if (!key.empty()) {
      EXPECT_EQ(store_->Scan(key).status().code(), absl::StatusCode::kInvalidArgument) << message;
    }
  }
  EXPECT_EQ(CheckStoreKey(std::string(kMaxKeyBytes, '~')), absl::OkStatus());
  EXPECT_EQ(CheckStoreKey(" "), absl::OkStatus());
}

TEST_P(StoreTest, Commit_FromFourThreads_AllApplied) {
  constexpr int kThreads = 4;
  constexpr int kCommits = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kCommits; ++i) {
        const std::string prefix = absl::StrCat("t", t, "/");
        const std::string key = absl::StrCat(prefix, i / 10, i % 10);
        EXPECT_EQ(store_->Commit({StoreWrite::Put(key, "x"), StoreWrite::Put(key + "/2", "y")}),
                  absl::OkStatus());
        absl::StatusOr<std::optional<std::string>> got = store_->Get(key);
        EXPECT_TRUE(got.ok() && *got == "x") << key;
        absl::StatusOr<KeyValues> mine = store_->Scan(prefix);
        EXPECT_TRUE(mine.ok() && mine->size() == static_cast<size_t>(2 * (i + 1))) << key;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(MustScan(absl::StrCat("t", t, "/")).size(), 2u * kCommits) << t;
  }
}

// Random batches over a small alphabet that is dense in prefixes, '%', '_'
// and '~', checked after every commit against a std::map.
TEST_P(StoreTest, Commit_RandomBatches_MatchMapModel) {
  std::mt19937 rng(20240611);
  const std::string alphabet = "a%_~/";
  auto random_key = [&] {
    std::string key(1 + rng() % 3, ' ');
    for (char& c : key) c = alphabet[rng() % alphabet.size()];
    return key;
  };
  std::map<std::string, std::string> model;
  for (int batch = 0; batch < 60; ++batch) {
    std::vector<StoreWrite> writes;
    const int n = 1 + rng() % 5;
    for (int i = 0; i < n; ++i) {
      const std::string key = random_key();
      switch (rng() % 4) {
        case 0:
        case 1: {
          const std::string value = absl::StrCat(batch, ".", i);
          writes.push_back(StoreWrite::Put(key, value));
          model[key] = value;
          break;
        }
        case 2:
          writes.push_back(StoreWrite::Delete(key));
          model.erase(key);
          break;
        case 3:
          writes.push_back(StoreWrite::DeletePrefix(key));
          for (auto it = model.lower_bound(key);
               it != model.end() && it->first.compare(0, key.size(), key) == 0;) {
            it = model.erase(it);
          }
          break;
      }
    }
    MustCommit(writes);
    ASSERT_EQ(MustScan(""), KeyValues(model.begin(), model.end())) << "batch " << batch;
    const std::string prefix = random_key();
    KeyValues expected;
    for (const auto& kv : model) {
      if (kv.first.compare(0, prefix.size(), prefix) == 0) expected.push_back(kv);
    }
    ASSERT_EQ(MustScan(prefix), expected) << "batch " << batch << " prefix " << prefix;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

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
