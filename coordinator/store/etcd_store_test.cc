// EtcdStore and LeaderElection against a real etcd, started on loopback by
// the test from Debian 12's etcd-server package: the Store contract, etcd's
// limits, endpoint failover, durability across a SIGKILLed etcd, and
// leader election with failover and the Commit fence.
//
// One etcd serves every test (a global environment starts it and kills it
// at the end); each test works under a prefix of its own. The durability
// test runs a second etcd that it kills and restarts.
//
// Ports: etcd needs explicit client and peer ports. Each is found by binding
// a socket to 127.0.0.1:0 and closing it. Another process could take the
// port before etcd binds it; etcd then exits at start-up, and the test
// starts it again on new ports.
//
// No sleeps for synchronisation: every wait polls a condition (etcd answers,
// a leader is elected) until a deadline.
#include "coordinator/store/etcd_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "common/testing/silenceable_relay.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/etcd_testing.h"
#include "coordinator/store/leader_election.h"
#include "coordinator/store/store.h"
#include "coordinator/store/store_contract_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

// Test timings (etcd_testing.h starts the etcd).
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
// etcd's smallest TTL with its default election timeout: failover tests
// wait about this long.
constexpr absl::Duration kTtl = absl::Seconds(2);
// A leader must be replaced within this long after it stops renewing.
constexpr absl::Duration kFailoverLimit = absl::Seconds(2 + 5);  // kTtl + 5 s

// Polls `done` until it holds or `timeout` has passed; returns whether it
// holds.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(kPollInterval);
  }
  return true;
}

// The etcd every test shares.
EtcdProcess* shared_etcd = nullptr;

class SharedEtcdEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("shared");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    shared_etcd = etcd_.get();
  }
  void TearDown() override {
    shared_etcd = nullptr;
    etcd_.reset();  // Kills it.
  }

 private:
  std::unique_ptr<EtcdProcess> etcd_;
};

[[maybe_unused]] ::testing::Environment* const kSharedEtcd =
    ::testing::AddGlobalTestEnvironment(new SharedEtcdEnvironment);

// A prefix no other test uses.
std::string NewPrefix() {
  static std::atomic<int> next{0};
  return absl::StrCat("/test/", next.fetch_add(1), "/");
}

EtcdOptions SharedOptions(const std::string& prefix) {
  EXPECT_NE(shared_etcd, nullptr);
  return shared_etcd->Options(prefix);
}

std::unique_ptr<EtcdStore> MustOpen(EtcdOptions options,
                                    const LeadershipView* leadership = nullptr) {
  absl::StatusOr<std::unique_ptr<EtcdStore>> store =
      EtcdStore::Open(std::move(options), leadership);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

// A raw client, to look at etcd behind the store's back.
std::unique_ptr<EtcdClient> RawClient(const std::string& prefix) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(SharedOptions(prefix));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

std::optional<mvccpb::KeyValue> RawGet(const EtcdClient& client, const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  absl::Status status = client.Range(request, &response);
  EXPECT_TRUE(status.ok()) << status;
  if (!status.ok() || response.kvs_size() == 0) return std::nullopt;
  return response.kvs(0);
}

// ---------------------------------------------------------------------------
// The Store contract.

absl::StatusOr<std::unique_ptr<Store>> OpenContractStore(int scan_page_keys) {
  if (shared_etcd == nullptr) return absl::FailedPreconditionError("no etcd (see above)");
  EtcdOptions options = shared_etcd->Options(NewPrefix());
  options.scan_page_keys = scan_page_keys;
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Open(std::move(options));
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(std::move(*store));
}

INSTANTIATE_TEST_SUITE_P(
    Etcd, StoreContractTest,
    ::testing::Values(StoreBackend{"Etcd",
                                   [] { return OpenContractStore(EtcdOptions().scan_page_keys); }},
                      // Two keys a page: every Scan of more pages through continuations.
                      StoreBackend{"EtcdTwoKeyPages", [] { return OpenContractStore(2); }}),
    StoreBackendName);

// ---------------------------------------------------------------------------
// EtcdStore's own behaviour.

TEST(EtcdStoreTest, Open_BadOptions_InvalidArgument) {
  const std::vector<std::pair<std::function<void(EtcdOptions&)>, std::string>> cases = {
      {[](EtcdOptions& o) { o.endpoints.clear(); }, "etcd endpoints are empty"},
      {[](EtcdOptions& o) { o.endpoints = {"localhost"}; }, "\"localhost\" is not host:port"},
      {[](EtcdOptions& o) { o.endpoints = {"https://h:2379"}; }, "no TLS is configured"},
      {[](EtcdOptions& o) { o.prefix = ""; }, "etcd prefix: store key is empty"},
      {[](EtcdOptions& o) { o.rpc_timeout = absl::ZeroDuration(); }, "rpc_timeout"},
      {[](EtcdOptions& o) { o.max_txn_ops = 0; }, "max_txn_ops"},
      {[](EtcdOptions& o) { o.scan_page_keys = 0; }, "scan_page_keys"},
      {[](EtcdOptions& o) { o.compaction_interval_commits = 0; }, "compaction_interval_commits"},
      {[](EtcdOptions& o) { o.kept_revisions = 0; }, "kept_revisions"},
      {[](EtcdOptions& o) { o.compaction_interval_bytes = 0; }, "compaction_interval_bytes"},
  };
  for (const auto& [change, message] : cases) {
    EtcdOptions options = SharedOptions(NewPrefix());
    change(options);
    absl::Status status = EtcdStore::Open(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(status.message(), HasSubstr(message));
  }
}

TEST(EtcdStoreTest, Open_NothingListening_UnavailableNamingEndpoint) {
  const std::string dead = absl::StrCat("127.0.0.1:", FreePort());
  EtcdOptions options = SharedOptions(NewPrefix());
  options.endpoints = {dead};
  absl::Status status = EtcdStore::Open(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("etcd Range at ", dead)));
}

TEST(EtcdStoreTest, Open_FirstEndpointDown_UsesTheNext) {
  const std::string dead = absl::StrCat("127.0.0.1:", FreePort());
  const std::string prefix = NewPrefix();
  EtcdOptions options = SharedOptions(prefix);
  options.endpoints = {dead, "http://" + shared_etcd->endpoint()};
  std::unique_ptr<EtcdStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(),
            absl::StrCat("etcd:", dead, ",", shared_etcd->endpoint(), " prefix ", prefix));
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
  absl::StatusOr<std::optional<std::string>> value = store->Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST(EtcdStoreTest, Commit_Put_StoredUnderPrefixKv) {
  const std::string prefix = NewPrefix();
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(prefix));
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Commit({StoreWrite::Put("jobs/a", "alpha")}), absl::OkStatus());
  std::unique_ptr<EtcdClient> raw = RawClient(prefix);
  std::optional<mvccpb::KeyValue> kv = RawGet(*raw, prefix + "kv/jobs/a");
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->value(), "alpha");
}

TEST(EtcdStoreTest, Commit_MoreOperationsThanEtcdAllows_InvalidArgumentNothingApplied) {
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(NewPrefix()));
  ASSERT_NE(store, nullptr);
  // 127 puts and the write sequence's.
  std::vector<StoreWrite> at_limit;
  for (int i = 0; i < 127; ++i) at_limit.push_back(StoreWrite::Put(absl::StrCat("a/", i), "v"));
  ASSERT_EQ(store->Commit(at_limit), absl::OkStatus());

  std::vector<StoreWrite> over = at_limit;
  over.push_back(StoreWrite::Put("a/one-more", "v"));
  absl::Status status = store->Commit(over);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("batch of 128 writes needs 129 etcd operations (one is the store's write "
                        "sequence); the limit is 128 (etcd --max-txn-ops)"));
  // A prefix delete with 64 puts under it: 64 puts and 65 cut-out ranges.
  std::vector<StoreWrite> cut = {StoreWrite::DeletePrefix("b/")};
  for (int i = 0; i < 64; ++i) cut.push_back(StoreWrite::Put(absl::StrCat("b/", 10 + i), "v"));
  status = store->Commit(cut);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("batch of 65 writes needs 130 etcd operations"));
  absl::StatusOr<std::optional<std::string>> value = store->Get("a/one-more");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::nullopt);
}

TEST(EtcdStoreTest, Commit_OptionsAboveEtcdsLimit_EtcdRefusesInvalidArgument) {
  EtcdOptions options = SharedOptions(NewPrefix());
  options.max_txn_ops = 1000;  // etcd still has its default, 128.
  std::unique_ptr<EtcdStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  std::vector<StoreWrite> writes;
  for (int i = 0; i < 200; ++i) writes.push_back(StoreWrite::Put(absl::StrCat("k", i), "v"));
  absl::Status status = store->Commit(writes);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("too many operations in txn request"));
  EXPECT_THAT(status.message(), HasSubstr("etcd refused the request"));
}

TEST(EtcdStoreTest, Commit_BatchOverRequestBytes_InvalidArgument) {
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(NewPrefix()));
  ASSERT_NE(store, nullptr);
  const std::string big(kMaxValueBytes, 'v');
  absl::Status status = store->Commit({StoreWrite::Put("one", big), StoreWrite::Put("two", big)});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("the limit is 1572864 (etcd --max-request-bytes)"));
}

// A Commit that timed out may be applied later, by a member that accepted
// it and stalled, after a later Commit succeeded through another member.
// Replayed here by hand: the stale Txn must change nothing. Before, it
// carried only the leader fence, which holds within a term, and wrote the
// job's RUNNING record over its final CANCELLED one.
TEST(EtcdStoreTest, Commit_StaleTxnAppliedAfterALaterCommit_ChangesNothing) {
  const std::string prefix = NewPrefix();
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(prefix));
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Commit({StoreWrite::Put("jobs/a", "PENDING")}), absl::OkStatus());
  absl::StatusOr<etcdserverpb::TxnRequest> stale =
      store->BuildTxnForTesting({StoreWrite::Put("jobs/a", "RUNNING"), StoreWrite::Delete("b")});
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_EQ(store->Commit({StoreWrite::Put("jobs/a", "CANCELLED"), StoreWrite::Put("b", "1")}),
            absl::OkStatus());

  std::unique_ptr<EtcdClient> raw = RawClient(prefix);
  etcdserverpb::TxnResponse response;
  ASSERT_EQ(raw->Txn(*stale, &response), absl::OkStatus());
  EXPECT_FALSE(response.succeeded());
  EXPECT_EQ(store->Get("jobs/a").value(), std::optional<std::string>("CANCELLED"));
  EXPECT_EQ(store->Get("b").value(), std::optional<std::string>("1"));
  // The replay wrote nothing, so the store's next Commit goes through at once.
  ASSERT_EQ(store->Commit({StoreWrite::Put("jobs/a", "ENDED")}), absl::OkStatus());
  EXPECT_EQ(store->Get("jobs/a").value(), std::optional<std::string>("ENDED"));
}

// The sequence key changed behind the store's back (its own timed-out
// Commit applied late, or another store on the prefix): the Commit reads
// it again and goes through.
TEST(EtcdStoreTest, Commit_SequenceKeyChangedByAnotherWriter_ReadAgainAndApplied) {
  const std::string prefix = NewPrefix();
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(prefix));
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "1")}), absl::OkStatus());
  std::unique_ptr<EtcdClient> raw = RawClient(prefix);
  etcdserverpb::TxnRequest bump;
  bump.add_success()->mutable_request_put()->set_key(prefix + "seq");
  etcdserverpb::TxnResponse bumped;
  ASSERT_EQ(raw->Txn(bump, &bumped), absl::OkStatus());

  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "2")}), absl::OkStatus());
  EXPECT_EQ(store->Get("k").value(), std::optional<std::string>("2"));
  const std::optional<mvccpb::KeyValue> seq = RawGet(*raw, prefix + "seq");
  ASSERT_TRUE(seq.has_value());
  EXPECT_GT(seq->mod_revision(), bumped.header().revision());
  EXPECT_EQ(seq->version(), 3);  // the first Commit, the bump, the retried Commit
}

// Commits from several threads of one store are serialised, so none fails
// another's sequence compare: each applies with exactly one Txn.
TEST(EtcdStoreTest, Commit_FromFourThreads_AllAppliedOneTxnEach) {
  const std::string prefix = NewPrefix();
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(prefix));
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4;
  constexpr int kCommits = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < kCommits; ++i) {
        EXPECT_EQ(store->Commit({StoreWrite::Put(absl::StrCat("t", t, "/", 10 + i), "x")}),
                  absl::OkStatus());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> mine =
        store->Scan(absl::StrCat("t", t, "/"));
    ASSERT_TRUE(mine.ok()) << mine.status();
    EXPECT_EQ(mine->size(), static_cast<size_t>(kCommits)) << t;
  }
  std::unique_ptr<EtcdClient> raw = RawClient(prefix);
  const std::optional<mvccpb::KeyValue> seq = RawGet(*raw, prefix + "seq");
  ASSERT_TRUE(seq.has_value());
  EXPECT_EQ(seq->version(), kThreads * kCommits);
}

TEST(EtcdStoreTest, Scan_PagesOverResponseLimit_ReadAtHalfSize) {
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(NewPrefix()));
  ASSERT_NE(store, nullptr);
  // 20 MiB in all: more than kMaxEtcdResponseBytes in one page.
  constexpr int kKeys = 20;
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_EQ(store->Commit({StoreWrite::Put(absl::StrCat("big/", 10 + i),
                                             std::string(kMaxValueBytes, 'a' + i))}),
              absl::OkStatus());
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> found = store->Scan("big/");
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    EXPECT_EQ((*found)[i].first, absl::StrCat("big/", 10 + i));
    EXPECT_EQ((*found)[i].second, std::string(kMaxValueBytes, 'a' + i)) << i;
  }
}

// etcd keeps every revision of a key until its history is compacted, and
// does not compact by default: a long job's saves (one a second) filled
// its 2 GiB quota within a day, and then etcd refused every write. The
// store compacts every compaction_interval_commits Commits, keeping the
// last kept_revisions revisions. On an etcd of its own: compaction is
// etcd-wide.
TEST(EtcdStoreTest, Commit_EveryInterval_CompactsTheHistory) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("compaction");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EtcdOptions options = (*etcd)->Options("/compact/");
  options.compaction_interval_commits = 10;
  options.kept_revisions = 3;
  std::unique_ptr<EtcdStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::unique_ptr<EtcdClient>> raw = EtcdClient::Create(options);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const auto value_at = [&](int64_t revision) -> absl::StatusOr<std::string> {
    etcdserverpb::RangeRequest request;
    request.set_key("/compact/kv/k");
    request.set_revision(revision);
    etcdserverpb::RangeResponse response;
    RETURN_IF_ERROR((*raw)->Range(request, &response));
    if (response.kvs_size() == 0) return absl::NotFoundError("no value");
    return response.kvs(0).value();
  };
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "0")}), absl::OkStatus());
  const std::optional<mvccpb::KeyValue> first = RawGet(**raw, "/compact/kv/k");
  ASSERT_TRUE(first.has_value());
  for (int i = 1; i <= 8; ++i) {
    ASSERT_EQ(store->Commit({StoreWrite::Put("k", absl::StrCat(i))}), absl::OkStatus());
  }
  // Nine commits: the first value is still in the history.
  EXPECT_EQ(value_at(first->mod_revision()).value_or("?"), "0");
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "9")}), absl::OkStatus());  // the tenth
  // Compacted up to 3 revisions before the tenth write: the first is gone,
  // the last three are kept, and the store reads as before.
  const std::optional<mvccpb::KeyValue> tenth = RawGet(**raw, "/compact/kv/k");
  ASSERT_TRUE(tenth.has_value());
  EXPECT_EQ(value_at(first->mod_revision()).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(value_at(tenth->mod_revision() - 3).value_or("?"), "6");
  EXPECT_EQ(store->Get("k").value(), std::optional<std::string>("9"));
}

// Records may be up to 1 MiB: a thousand commits of them would keep 1 GiB
// of history, half of etcd's default quota. So the store also compacts once
// its commits since the last compaction carried compaction_interval_bytes,
// and keeps no more of its history than that many bytes (not
// kept_revisions' 1000 commits).
TEST(EtcdStoreTest, Commit_LargeRecords_CompactsByBytesBeforeTheCommitInterval) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("compaction-bytes");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EtcdOptions options = (*etcd)->Options("/bytes/");
  options.compaction_interval_commits = 1000;
  options.compaction_interval_bytes = 10000;
  options.kept_revisions = 1000;
  std::unique_ptr<EtcdStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::unique_ptr<EtcdClient>> raw = EtcdClient::Create(options);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const auto status_at = [&](int64_t revision) {
    etcdserverpb::RangeRequest request;
    request.set_key("/bytes/kv/k");
    request.set_revision(revision);
    etcdserverpb::RangeResponse response;
    return (*raw)->Range(request, &response);
  };
  const std::string record(4000, 'r');  // each Txn carries a little more
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", record)}), absl::OkStatus());
  const std::optional<mvccpb::KeyValue> first = RawGet(**raw, "/bytes/kv/k");
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", record)}), absl::OkStatus());
  EXPECT_EQ(status_at(first->mod_revision()), absl::OkStatus());  // about 8,000 bytes so far
  const std::optional<mvccpb::KeyValue> second = RawGet(**raw, "/bytes/kv/k");
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", record)}), absl::OkStatus());  // over 10,000
  // The last two commits carry under 10,000 bytes: they stay, the first goes.
  EXPECT_EQ(status_at(first->mod_revision()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(status_at(second->mod_revision()), absl::OkStatus());
  EXPECT_EQ(store->Get("k").value(), std::optional<std::string>(record));
}

TEST(EtcdStoreTest, Commit_AcknowledgedThenEtcdKilled_FoundAfterRestart) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("restart");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::unique_ptr<EtcdStore> store = MustOpen((*etcd)->Options("/durable/"));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(store->Commit({StoreWrite::DeletePrefix("latest/"),
                             StoreWrite::Put(absl::StrCat("batch/", 10 + i), "done"),
                             StoreWrite::Put(absl::StrCat("latest/", i), "x")}),
              absl::OkStatus());
  }
  (*etcd)->Kill();
  absl::Status down = store->Get("batch/10").status();
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_THAT(down.message(), HasSubstr((*etcd)->endpoint()));

  ASSERT_EQ((*etcd)->Restart(), absl::OkStatus());
  // The store's channel reconnects on its own (backoff at most 1 s).
  ASSERT_TRUE(WaitFor([&] { return store->Get("batch/10").ok(); }, absl::Seconds(30)));
  std::unique_ptr<EtcdStore> reopened = MustOpen((*etcd)->Options("/durable/"));
  ASSERT_NE(reopened, nullptr);
  for (Store* s : {static_cast<Store*>(store.get()), static_cast<Store*>(reopened.get())}) {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> latest = s->Scan("latest/");
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_THAT(*latest, ElementsAre(Pair("latest/19", "x")));
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> batches = s->Scan("batch/");
    ASSERT_TRUE(batches.ok()) << batches.status();
    EXPECT_EQ(batches->size(), 20u);
  }
}

// ---------------------------------------------------------------------------
// LeaderElection.

// Records on_change calls; thread-safe.
class Changes {
 public:
  void Record(bool is_leader) {
    AnnotatedMutexLock lock(&mu_);
    seen_.push_back(is_leader);
  }
  std::vector<bool> Seen() {
    AnnotatedMutexLock lock(&mu_);
    return seen_;
  }

 private:
  AnnotatedMutex mu_;
  std::vector<bool> seen_ ABSL_GUARDED_BY(mu_);
};

// A started election of `identity` over `etcd`, on_change recorded in
// `changes`; null (and a test failure) if it cannot be created.
std::unique_ptr<LeaderElection> NewElection(const EtcdOptions& etcd, const std::string& identity,
                                            Changes* changes) {
  LeaderElectionOptions options;
  options.identity = identity;
  options.ttl = kTtl;
  options.on_change = [changes](bool is_leader) { changes->Record(is_leader); };
  absl::StatusOr<std::unique_ptr<LeaderElection>> election =
      LeaderElection::Create(etcd, std::move(options));
  EXPECT_TRUE(election.ok()) << election.status();
  if (!election.ok()) return nullptr;
  absl::Status started = (*election)->Start();
  EXPECT_TRUE(started.ok()) << started;
  return std::move(*election);
}

// The same, over the etcd every test shares, under `prefix`.
std::unique_ptr<LeaderElection> NewElection(const std::string& prefix, const std::string& identity,
                                            Changes* changes) {
  return NewElection(SharedOptions(prefix), identity, changes);
}

// Two participants under one prefix; waits until exactly one leads and the
// other names it.
class ElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = NewElection(prefix_, "10.0.0.1:7070", &a_changes_);
    b_ = NewElection(prefix_, "10.0.0.2:7070", &b_changes_);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ASSERT_TRUE(WaitFor(
        [&] {
          if (a_->IsLeader() == b_->IsLeader()) return false;
          return (a_->IsLeader() ? b_ : a_)->Leader() == (a_->IsLeader() ? a_ : b_)->Leader();
        },
        absl::Seconds(20)))
        << "a: leader " << a_->IsLeader() << " names " << a_->Leader() << "; b: leader "
        << b_->IsLeader() << " names " << b_->Leader();
    const bool a_leads = a_->IsLeader();
    leader_ = a_leads ? &a_ : &b_;
    follower_ = a_leads ? &b_ : &a_;
    leader_changes_ = a_leads ? &a_changes_ : &b_changes_;
    follower_changes_ = a_leads ? &b_changes_ : &a_changes_;
    leader_id_ = a_leads ? "10.0.0.1:7070" : "10.0.0.2:7070";
    follower_id_ = a_leads ? "10.0.0.2:7070" : "10.0.0.1:7070";
  }

  // Waits until the follower leads; returns how long that took from `since`.
  absl::Duration AwaitFollowerLeads(absl::Time since) {
    EXPECT_TRUE(WaitFor([&] { return (*follower_)->IsLeader(); }, kFailoverLimit))
        << "follower still names " << (*follower_)->Leader();
    return absl::Now() - since;
  }

  const std::string prefix_ = NewPrefix();
  Changes a_changes_, b_changes_;
  std::unique_ptr<LeaderElection> a_, b_;
  std::unique_ptr<LeaderElection>* leader_ = nullptr;
  std::unique_ptr<LeaderElection>* follower_ = nullptr;
  Changes* leader_changes_ = nullptr;
  Changes* follower_changes_ = nullptr;
  std::string leader_id_, follower_id_;
};

TEST_F(ElectionTest, Start_TwoParticipants_ExactlyOneLeadsAndTheOtherNamesIt) {
  EXPECT_EQ((*leader_)->Leader(), leader_id_);
  EXPECT_EQ((*follower_)->Leader(), leader_id_);
  EXPECT_EQ(leader_changes_->Seen(), std::vector<bool>({true}));
  EXPECT_EQ(follower_changes_->Seen(), std::vector<bool>());
  EXPECT_EQ((*follower_)->CurrentTerm(), std::nullopt);
  std::optional<LeaderTerm> term = (*leader_)->CurrentTerm();
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->key, prefix_ + "leader");
  EXPECT_EQ(term->identity, leader_id_);

  std::unique_ptr<EtcdClient> raw = RawClient(prefix_);
  std::optional<mvccpb::KeyValue> kv = RawGet(*raw, prefix_ + "leader");
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->value(), leader_id_);
  EXPECT_EQ(kv->lease(), term->lease_id);
  EXPECT_EQ(kv->create_revision(), term->create_revision);

  // Renewals keep the lease, so the leader leads past several TTLs.
  EXPECT_FALSE(WaitFor([&] { return !(*leader_)->IsLeader(); }, 3 * kTtl));
  EXPECT_EQ((*leader_)->CurrentTerm()->create_revision, term->create_revision);
  EXPECT_EQ(leader_changes_->Seen(), std::vector<bool>({true}));
}

TEST_F(ElectionTest, Start_Twice_FailedPrecondition) {
  EXPECT_EQ((*leader_)->Start().code(), absl::StatusCode::kFailedPrecondition);
}

// A follower waits a tick; a leader no longer than its lease has left, so
// it steps down as its term ends rather than acting up to a tick beyond.
TEST(LeaderElectionTest, ElectionWait_ALeaderWakesWhenItsLeaseEnds) {
  const absl::Duration tick = absl::Seconds(1);
  EXPECT_EQ(ElectionWait(tick, std::nullopt), tick);
  EXPECT_EQ(ElectionWait(tick, absl::Seconds(3)), tick);
  EXPECT_EQ(ElectionWait(tick, absl::Milliseconds(300)), absl::Milliseconds(300));
  EXPECT_EQ(ElectionWait(tick, absl::ZeroDuration()), absl::ZeroDuration());
  EXPECT_EQ(ElectionWait(tick, -absl::Milliseconds(5)), absl::ZeroDuration());
}

TEST(LeaderElectionTest, Create_BadOptions_InvalidArgument) {
  LeaderElectionOptions no_identity;
  EXPECT_THAT(LeaderElection::Create(SharedOptions("/p/"), no_identity).status().message(),
              HasSubstr("election identity: store key is empty"));
  LeaderElectionOptions fractional;
  fractional.identity = "h:1";
  fractional.ttl = absl::Milliseconds(1500);
  absl::Status status = LeaderElection::Create(SharedOptions("/p/"), fractional).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("whole number of seconds"));
}

TEST_F(ElectionTest, Resign_FollowerTakesOver) {
  const absl::Time resigned = absl::Now();
  ASSERT_EQ((*leader_)->Resign(), absl::OkStatus());
  EXPECT_FALSE((*leader_)->IsLeader());
  EXPECT_EQ(leader_changes_->Seen(), std::vector<bool>({true, false}));
  const absl::Duration took = AwaitFollowerLeads(resigned);
  std::cout << "failover after Resign: " << absl::FormatDuration(took) << "\n";
  RecordProperty("failover_after_resign_ms", static_cast<int>(absl::ToInt64Milliseconds(took)));
  EXPECT_EQ((*follower_)->Leader(), follower_id_);
  EXPECT_EQ(follower_changes_->Seen(), std::vector<bool>({true}));
  EXPECT_EQ((*leader_)->Resign(), absl::OkStatus());  // Idempotent.
}

TEST_F(ElectionTest, LeaderDestroyedWithoutResign_FollowerTakesOverOnceLeaseExpires) {
  const absl::Time stopped = absl::Now();
  leader_->reset();  // Renewals stop; the lease runs out in etcd.
  const absl::Duration took = AwaitFollowerLeads(stopped);
  std::cout << "failover after the leader stopped renewing (ttl " << absl::FormatDuration(kTtl)
            << "): " << absl::FormatDuration(took) << "\n";
  RecordProperty("failover_after_stop_ms", static_cast<int>(absl::ToInt64Milliseconds(took)));
  // Not before the lease ran out: renewed at most ttl/3 before the stop,
  // it had at least 2/3 of the TTL left (half, with a margin for clocks).
  EXPECT_GE(took, kTtl / 2);
  EXPECT_EQ((*follower_)->Leader(), follower_id_);
}

TEST_F(ElectionTest, LeaseRevokedBehindLeadersBack_LeaderStepsDownAndOneLeads) {
  std::optional<LeaderTerm> term = (*leader_)->CurrentTerm();
  ASSERT_TRUE(term.has_value());
  std::unique_ptr<EtcdClient> raw = RawClient(prefix_);
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(term->lease_id);
  ASSERT_EQ(raw->LeaseRevoke(revoke), absl::OkStatus());
  // Within a tick or a renewal (ttl/3), not a whole TTL.
  ASSERT_TRUE(WaitFor(
      [&] {
        std::optional<LeaderTerm> now = (*leader_)->CurrentTerm();
        return !now.has_value() || now->create_revision != term->create_revision;
      },
      kTtl));
  std::vector<bool> seen = leader_changes_->Seen();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[1], false);
  ASSERT_TRUE(WaitFor([&] { return a_->IsLeader() != b_->IsLeader(); }, kFailoverLimit));
}

// etcd unreachable (killed here; a partition alike): the leader's
// renewals fail until its lease runs out by its own clock, and then it
// steps down (on_change(false), on which the coordinator exits), as etcd
// lets another lead. Before, only a lease etcd said was gone stepped down.
TEST(ElectionAloneTest, EtcdUnreachable_LeaderStepsDownWhenItsLeaseRunsOut) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("unreachable");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  Changes changes;
  const std::unique_ptr<LeaderElection> election =
      NewElection((*etcd)->Options("/alone/"), "10.0.0.1:7070", &changes);
  ASSERT_NE(election, nullptr);
  ASSERT_TRUE(WaitFor([&] { return election->IsLeader(); }, absl::Seconds(20)));
  (*etcd)->Kill();
  EXPECT_TRUE(WaitFor(
      [&] {
        return changes.Seen() == std::vector<bool>({true, false});
      },
      3 * kTtl))
      << "on_change calls: " << changes.Seen().size();
  EXPECT_FALSE(election->IsLeader());
  EXPECT_EQ(election->Leader(), "");  // not itself
}

// A store opened while its first endpoint is silent (a member whose host
// powered off: its handshake never completes) goes on to the next: a newly
// elected leader's store failed its first call there, and the coordinator
// exited, every one of them in turn.
TEST(EtcdStoreTest, Open_FirstEndpointSilent_UsesTheNext) {
  const std::string direct = shared_etcd->endpoint();
  SilenceableRelay relay(std::stoi(direct.substr(direct.rfind(':') + 1)));
  relay.Freeze();
  EtcdOptions options = SharedOptions(NewPrefix());
  options.endpoints = {relay.endpoint(), "http://" + direct};
  std::unique_ptr<EtcdStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> all = store->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 1u);
}

// The first endpoint answered, then its member went silent with the
// connection open (its host stalled): a read goes on to the next member
// within the same call, and a write is not sent again (it may have been
// applied at the silent one) but the next call starts at the next member.
// Before, the reads failed there too, so a newly elected coordinator, whose
// first act is to read the state, exited.
TEST(EtcdStoreTest, ConnectedFirstEndpointGoesSilent_ReadsUseTheNext) {
  const std::string direct = shared_etcd->endpoint();
  SilenceableRelay relay(std::stoi(direct.substr(direct.rfind(':') + 1)));
  EtcdOptions options = SharedOptions(NewPrefix());
  options.endpoints = {relay.endpoint(), "http://" + direct};
  options.rpc_timeout = absl::Seconds(1);
  std::unique_ptr<EtcdStore> store = MustOpen(options);
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());  // through the relay
  relay.Freeze();
  absl::StatusOr<std::optional<std::string>> got = store->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::optional<std::string>("v"));
  // A write, through another relay that answered and then went silent:
  // it fails there, and the next call goes to the healthy member.
  SilenceableRelay second(std::stoi(direct.substr(direct.rfind(':') + 1)));
  options.endpoints = {second.endpoint(), "http://" + direct};
  std::unique_ptr<EtcdStore> writer = MustOpen(options);
  ASSERT_NE(writer, nullptr);
  // Through the second relay; a Commit, so that the next one need not read
  // the write sequence first (a read, which would move on to the next).
  ASSERT_EQ(writer->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
  second.Freeze();
  const absl::Status timed_out = writer->Commit({StoreWrite::Put("k", "w")});
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kUnavailable) << timed_out;
  EXPECT_THAT(timed_out.message(), HasSubstr(second.endpoint()));
  EXPECT_EQ(writer->Commit({StoreWrite::Put("k", "w")}), absl::OkStatus());
}

// The leader's preferred endpoint goes silent while another member is
// healthy: each call spends a share of the lease's time there, then goes
// on to the healthy one, and the leader keeps its lease. Before, the
// renewal waited at the silent member for the whole lease, and the leader
// stepped down (and the coordinator exited).
TEST(ElectionAloneTest, PreferredEndpointGoesSilent_LeaderKeepsItsLease) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("silent");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string direct = (*etcd)->endpoint();
  SilenceableRelay relay(std::stoi(direct.substr(direct.rfind(':') + 1)));
  EtcdOptions etcd_options = (*etcd)->Options("/silent/");
  etcd_options.endpoints = {relay.endpoint(), direct};  // the relay first: preferred
  Changes changes;
  const std::unique_ptr<LeaderElection> election =
      NewElection(etcd_options, "10.0.0.1:7070", &changes);
  ASSERT_NE(election, nullptr);
  ASSERT_TRUE(WaitFor([&] { return election->IsLeader(); }, absl::Seconds(20)));
  relay.Freeze();
  EXPECT_FALSE(WaitFor([&] { return !election->IsLeader(); }, 3 * kTtl))
      << "stepped down when one of two members went silent";
  EXPECT_EQ(changes.Seen(), std::vector<bool>({true}));
}

// A leader key holding no coordinator identity (written by another program,
// or by hand) reads as no leader: the leader is named in every refusal's
// trailing metadata, where gRPC aborts the process on a control byte.
TEST(LeaderElectionTest, LeaderIdentityOf_OnlyWhatIdentitiesMayBe) {
  EXPECT_EQ(LeaderIdentityOf("10.0.0.2:7070"), "10.0.0.2:7070");
  EXPECT_EQ(LeaderIdentityOf(""), "");
  EXPECT_EQ(LeaderIdentityOf(std::string("10.0.0.9:7070\r\nx: 1", 19)), "");
  EXPECT_EQ(LeaderIdentityOf(std::string("a\0b", 3)), "");
  EXPECT_EQ(LeaderIdentityOf(std::string(600, 'a')), "");  // over CheckStoreKey's 512 bytes
}

// Holds one term forever, as an election that has not yet noticed its loss.
class FrozenLeadership : public LeadershipView {
 public:
  explicit FrozenLeadership(LeaderTerm term) : term_(std::move(term)) {}
  std::optional<LeaderTerm> CurrentTerm() const override { return term_; }
  std::string Leader() const override { return term_.identity; }

 private:
  const LeaderTerm term_;
};

TEST_F(ElectionTest, Commit_FromFollowerOrEndedTerm_FailedPreconditionNamingLeader) {
  std::unique_ptr<EtcdStore> leader_store = MustOpen(SharedOptions(prefix_), leader_->get());
  std::unique_ptr<EtcdStore> follower_store = MustOpen(SharedOptions(prefix_), follower_->get());
  ASSERT_NE(leader_store, nullptr);
  ASSERT_NE(follower_store, nullptr);
  ASSERT_EQ(leader_store->Commit({StoreWrite::Put("jobs/a", "1")}), absl::OkStatus());
  ASSERT_EQ(leader_store->Commit({}), absl::OkStatus());

  absl::Status status = follower_store->Commit({StoreWrite::Put("jobs/a", "2")});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("not the leader (leader is ", leader_id_,
                                                       "): this coordinator lost the election")));
  EXPECT_EQ(follower_store->Commit({}).code(), absl::StatusCode::kFailedPrecondition);

  // The old leader's term, as seen by an election that has not noticed yet.
  std::optional<LeaderTerm> old_term = (*leader_)->CurrentTerm();
  ASSERT_TRUE(old_term.has_value());
  FrozenLeadership frozen(*old_term);
  std::unique_ptr<EtcdStore> stale_store = MustOpen(SharedOptions(prefix_), &frozen);
  ASSERT_NE(stale_store, nullptr);

  ASSERT_EQ((*leader_)->Resign(), absl::OkStatus());
  AwaitFollowerLeads(absl::Now());
  status = leader_store->Commit({StoreWrite::Put("jobs/a", "3")});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("not the leader"));
  // The fence in etcd refuses what the local check let through.
  status = stale_store->Commit({StoreWrite::Put("jobs/a", "4"), StoreWrite::Delete("jobs/b")});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("not the leader (leader is ", follower_id_,
                                                       "): the term of ", leader_id_)));
  EXPECT_THAT(status.message(), HasSubstr("has ended"));
  // A leader key someone else overwrote (keeping its lease): its value is
  // not an identity, and is not quoted.
  {
    std::unique_ptr<EtcdClient> raw = RawClient(prefix_);
    const std::optional<mvccpb::KeyValue> held = RawGet(*raw, prefix_ + "leader");
    ASSERT_TRUE(held.has_value());
    etcdserverpb::TxnRequest txn;
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(prefix_ + "leader");
    put->set_value("10.0.0.9:7070\r\nforged: yes");
    put->set_lease(held->lease());
    etcdserverpb::TxnResponse response;
    ASSERT_EQ(raw->Txn(txn, &response), absl::OkStatus());
    status = stale_store->Commit({StoreWrite::Put("jobs/a", "4")});
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("not the leader (no leader is elected now"));
    EXPECT_THAT(status.message(), Not(HasSubstr("forged")));
    put->set_value(follower_id_);
    ASSERT_EQ(raw->Txn(txn, &response), absl::OkStatus());
  }

  ASSERT_EQ(follower_store->Commit({StoreWrite::Put("jobs/b", "5")}), absl::OkStatus());
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> jobs =
      follower_store->Scan("jobs/");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_THAT(*jobs, ElementsAre(Pair("jobs/a", "1"), Pair("jobs/b", "5")));
}

TEST_F(ElectionTest, StoreKeys_CannotReachTheLeaderKey) {
  std::unique_ptr<EtcdStore> store = MustOpen(SharedOptions(prefix_), leader_->get());
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Commit({StoreWrite::Put("leader", "me"), StoreWrite::DeletePrefix("l")}),
            absl::OkStatus());
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> all = store->Scan("");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre());
  std::unique_ptr<EtcdClient> raw = RawClient(prefix_);
  std::optional<mvccpb::KeyValue> kv = RawGet(*raw, prefix_ + "leader");
  ASSERT_TRUE(kv.has_value());
  EXPECT_EQ(kv->value(), leader_id_);
  ASSERT_EQ(store->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
}

}  // namespace
}  // namespace pipetrain
