#include "coordinator/store/store_contract_testing.h"

#include <map>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace pipetrain {

void PrintTo(const StoreBackend& backend, std::ostream* os) { *os << backend.name; }

std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info) {
  return info.param.name;
}

void StoreContractTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Store>> store = GetParam().open();
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = std::move(*store);
}

void StoreContractTest::MustCommit(const std::vector<StoreWrite>& writes) {
  absl::Status status = store_->Commit(writes);
  ASSERT_TRUE(status.ok()) << status;
}

std::optional<std::string> StoreContractTest::MustGet(const std::string& key) {
  absl::StatusOr<std::optional<std::string>> value = store_->Get(key);
  EXPECT_TRUE(value.ok()) << value.status();
  return value.ok() ? *value : std::nullopt;
}

StoreContractTest::KeyValues StoreContractTest::MustScan(const std::string& prefix) {
  absl::StatusOr<KeyValues> found = store_->Scan(prefix);
  EXPECT_TRUE(found.ok()) << found.status();
  return found.ok() ? *found : KeyValues();
}

std::vector<std::string> StoreContractTest::Keys(const std::string& prefix) {
  std::vector<std::string> keys;
  for (const auto& kv : MustScan(prefix)) keys.push_back(kv.first);
  return keys;
}

void StoreContractTest::PutAll(const std::vector<std::string>& keys) {
  std::vector<StoreWrite> writes;
  for (const std::string& key : keys) writes.push_back(StoreWrite::Put(key, key));
  MustCommit(writes);
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using KeyValues = StoreContractTest::KeyValues;

// The cases.
TEST_P(StoreContractTest, Get_MissingKey_ReturnsNullopt) {
  EXPECT_EQ(MustGet("jobs/none"), std::nullopt);
}

TEST_P(StoreContractTest, Commit_Put_GetReturnsValue) {
  const std::string binary("\0\x01\xff\x80 z", 6);
  MustCommit({StoreWrite::Put("jobs/a", "alpha"), StoreWrite::Put("jobs/bin", binary),
              StoreWrite::Put("jobs/empty", "")});
  EXPECT_EQ(MustGet("jobs/a"), "alpha");
  EXPECT_EQ(MustGet("jobs/bin"), binary);
  EXPECT_EQ(MustGet("jobs/empty"), std::string());  // Present, not nullopt.
}

TEST_P(StoreContractTest, Commit_PutExistingKey_Overwrites) {
  MustCommit({StoreWrite::Put("k", "one")});
  MustCommit({StoreWrite::Put("k", "two")});
  EXPECT_EQ(MustGet("k"), "two");
  EXPECT_THAT(MustScan("k"), ElementsAre(Pair("k", "two")));
}

TEST_P(StoreContractTest, Commit_Delete_RemovesOnlyThatKey) {
  PutAll({"a", "a/b", "b"});
  MustCommit({StoreWrite::Delete("a"), StoreWrite::Delete("missing")});
  EXPECT_EQ(MustGet("a"), std::nullopt);
  EXPECT_THAT(Keys(""), ElementsAre("a/b", "b"));
}

TEST_P(StoreContractTest, Commit_MixedBatch_AppliesInOrder) {
  PutAll({"c/old"});
  MustCommit({StoreWrite::Put("a", "1"), StoreWrite::Delete("a"), StoreWrite::Put("b", "1"),
              StoreWrite::Put("b", "2"), StoreWrite::DeletePrefix("c/"),
              StoreWrite::Put("c/new", "3")});
  EXPECT_THAT(MustScan(""), ElementsAre(Pair("b", "2"), Pair("c/new", "3")));
}

TEST_P(StoreContractTest, Commit_EmptyBatch_Ok) {
  MustCommit({});
  EXPECT_THAT(MustScan(""), ElementsAre());
}

TEST_P(StoreContractTest, Commit_DeletePrefixWithWildcardCharacters_DeletesOnlyLiteralPrefix) {
  // LIKE would read '%' as "anything" and '_' as "any one character".
  PutAll({"a%", "a%b/1", "a%c", "aXb/1", "a_", "a_b", "abb", "a"});
  MustCommit({StoreWrite::DeletePrefix("a%")});
  EXPECT_THAT(Keys(""), ElementsAre("a", "aXb/1", "a_", "a_b", "abb"));
  MustCommit({StoreWrite::DeletePrefix("a_")});
  EXPECT_THAT(Keys(""), ElementsAre("a", "aXb/1", "abb"));
}

TEST_P(StoreContractTest, Commit_DeletePrefixEndingInTilde_DeletesEveryKeyUnderIt) {
  // '~' (0x7e) is the last printable byte: the prefix's successor is "x\x7f".
  PutAll({"x", "x}", "x~", "x~a", "x~~", "x~~~", "y", "~", "~~", "}"});
  MustCommit({StoreWrite::DeletePrefix("x~")});
  EXPECT_THAT(Keys(""), ElementsAre("x", "x}", "y", "}", "~", "~~"));
  MustCommit({StoreWrite::DeletePrefix("~")});
  EXPECT_THAT(Keys(""), ElementsAre("x", "x}", "y", "}"));
}

TEST_P(StoreContractTest, Commit_DeletePrefix_LeavesNeighboursAlone) {
  PutAll({"a", "aa~", "ab", "ab/1", "ab~", "abc", "ac", "b"});
  MustCommit({StoreWrite::DeletePrefix("ab")});
  EXPECT_THAT(Keys(""), ElementsAre("a", "aa~", "ac", "b"));
}

TEST_P(StoreContractTest, Scan_Prefix_AscendingByteOrderAndOnlyThePrefix) {
  PutAll({"jobs/b", "jobs/a~", "jobs/A", "jobs/a", "jobs/ a", "jobs", "jobs0", "job", "workers/1"});
  EXPECT_THAT(Keys("jobs/"), ElementsAre("jobs/ a", "jobs/A", "jobs/a", "jobs/a~", "jobs/b"));
  EXPECT_THAT(Keys("jobs"),
              ElementsAre("jobs", "jobs/ a", "jobs/A", "jobs/a", "jobs/a~", "jobs/b", "jobs0"));
  EXPECT_THAT(Keys("jobs/a"), ElementsAre("jobs/a", "jobs/a~"));
  EXPECT_THAT(Keys("nothing"), ElementsAre());
  EXPECT_THAT(MustScan("workers/"), ElementsAre(Pair("workers/1", "workers/1")));
}

TEST_P(StoreContractTest, Scan_EmptyPrefix_ReturnsEveryKey) {
  PutAll({"b", "a", "~", " "});
  EXPECT_THAT(Keys(""), ElementsAre(" ", "a", "b", "~"));
}

TEST_P(StoreContractTest, Scan_WildcardOrTildePrefix_IsLiteral) {
  PutAll({"a%", "a%1", "ab", "a_", "a_1", "a~", "a~~", "b"});
  EXPECT_THAT(Keys("a%"), ElementsAre("a%", "a%1"));
  EXPECT_THAT(Keys("a_"), ElementsAre("a_", "a_1"));
  EXPECT_THAT(Keys("a~"), ElementsAre("a~", "a~~"));
}

TEST_P(StoreContractTest, Commit_InvalidKeyMidBatch_ChangesNothing) {
  PutAll({"keep"});
  absl::Status status =
      store_->Commit({StoreWrite::Put("new", "1"), StoreWrite::Delete("keep"),
                      StoreWrite::Put("bad\nkey", "2"), StoreWrite::Put("later", "3")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("write #2"));
  EXPECT_THAT(status.message(), HasSubstr("0x0a at offset 3"));
  EXPECT_THAT(Keys(""), ElementsAre("keep"));
}

TEST_P(StoreContractTest, Commit_OversizedValueMidBatch_ChangesNothing) {
  absl::Status status =
      store_->Commit({StoreWrite::Put("a", "1"), StoreWrite::DeletePrefix("a"),
                      StoreWrite::Put("big", std::string(kMaxValueBytes + 1, 'v'))});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("write #2: value of key big is ", kMaxValueBytes + 1,
                                     " bytes; the limit is ", kMaxValueBytes)));
  EXPECT_THAT(Keys(""), ElementsAre());
}

TEST_P(StoreContractTest, Commit_KeyAndValueAtTheLimits_RoundTrip) {
  const std::string key(kMaxKeyBytes, 'k');
  const std::string value(kMaxValueBytes, '\xab');
  MustCommit({StoreWrite::Put(key, value)});
  EXPECT_EQ(MustGet(key), value);
}

TEST_P(StoreContractTest, Commit_BadKeys_InvalidArgument) {
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

TEST_P(StoreContractTest, Commit_FromFourThreads_AllApplied) {
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
TEST_P(StoreContractTest, Commit_RandomBatches_MatchMapModel) {
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

}  // namespace
}  // namespace pipetrain
