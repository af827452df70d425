// LeaderElection against a fake etcd: etcd's Auth, Lease and KV services
// served by the test on loopback (port 0), which count the calls and refuse
// them as told. The test steps rounds itself (LeaderElection::Round) and
// advances the lease's FakeClock by the pauses they ask for, so a run of ten
// minutes takes no real time and no sleep. The election against a real etcd
// is in etcd_store_test.
#include "coordinator/store/leader_election.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/testing/log_lines.h"
#include "coordinator/store/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/etcd/rpc.grpc.pb.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// A single-member etcd that keeps keys and leases in memory, with auth
// enabled. Thread-safe (gRPC's threads serve it while the test reads it).
class FakeEtcd final : public etcdserverpb::Auth::Service,
                       public etcdserverpb::Lease::Service,
                       public etcdserverpb::KV::Service {
 public:
  // Logins fail as etcd fails a wrong password (INVALID_ARGUMENT, which
  // EtcdClient reports as UNAUTHENTICATED).
  void RefuseLogins(bool refuse) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_logins_ = refuse;
  }
  // Txns fail as etcd fails a user without write on the key.
  void RefuseTxns(bool refuse) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_txns_ = refuse;
  }
  // Logins fail as a member without a quorum does (UNAVAILABLE).
  void FailLoginsTransiently(bool fail) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_logins_ = fail;
  }
  int logins() const {
    std::lock_guard<std::mutex> lock(mu_);
    return logins_;
  }
  int txns() const {
    std::lock_guard<std::mutex> lock(mu_);
    return txns_;
  }
  int leases() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_lease_;
  }

  grpc::Status Authenticate(grpc::ServerContext*, const etcdserverpb::AuthenticateRequest* request,
                            etcdserverpb::AuthenticateResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++logins_;
    if (fail_logins_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "etcdserver: no leader");
    if (refuse_logins_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "etcdserver: authentication failed, invalid user ID or password");
    }
    response->set_token(absl::StrCat(request->name(), ".token"));
    return grpc::Status::OK;
  }

  grpc::Status LeaseGrant(grpc::ServerContext*, const etcdserverpb::LeaseGrantRequest* request,
                          etcdserverpb::LeaseGrantResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    response->set_id(++last_lease_);
    response->set_ttl(request->ttl());
    return grpc::Status::OK;
  }
  grpc::Status LeaseRevoke(grpc::ServerContext*, const etcdserverpb::LeaseRevokeRequest* request,
                           etcdserverpb::LeaseRevokeResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = keys_.begin(); it != keys_.end();) {
      it = it->second.lease() == request->id() ? keys_.erase(it) : std::next(it);
    }
    return grpc::Status::OK;
  }
  grpc::Status LeaseKeepAlive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<etcdserverpb::LeaseKeepAliveResponse,
                               etcdserverpb::LeaseKeepAliveRequest>* stream) override {
    etcdserverpb::LeaseKeepAliveRequest request;
    while (stream->Read(&request)) {
      etcdserverpb::LeaseKeepAliveResponse response;
      response.set_id(request.id());
      response.set_ttl(5);
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status Range(grpc::ServerContext*, const etcdserverpb::RangeRequest* request,
                     etcdserverpb::RangeResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    RangeLocked(request->key(), response);
    return grpc::Status::OK;
  }
  // Only what LeaderElection's campaign sends: create the key if absent,
  // else read it.
  grpc::Status Txn(grpc::ServerContext*, const etcdserverpb::TxnRequest* request,
                   etcdserverpb::TxnResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++txns_;
    if (refuse_txns_) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "etcdserver: permission denied");
    }
    const std::string& key = request->compare(0).key();
    if (keys_.count(key) != 0) {
      RangeLocked(key, response->add_responses()->mutable_response_range());
      return grpc::Status::OK;
    }
    const etcdserverpb::PutRequest& put = request->success(0).request_put();
    mvccpb::KeyValue& kv = keys_[key];
    kv.set_key(key);
    kv.set_value(put.value());
    kv.set_lease(put.lease());
    kv.set_create_revision(++revision_);
    response->set_succeeded(true);
    response->mutable_header()->set_revision(revision_);
    return grpc::Status::OK;
  }

 private:
  void RangeLocked(const std::string& key, etcdserverpb::RangeResponse* response) {
    auto it = keys_.find(key);
    if (it != keys_.end()) *response->add_kvs() = it->second;
  }

  mutable std::mutex mu_;
  bool refuse_logins_ = false;
  bool refuse_txns_ = false;
  bool fail_logins_ = false;
  int logins_ = 0;
  int txns_ = 0;
  int64_t last_lease_ = 0;
  int64_t revision_ = 1;
  std::map<std::string, mvccpb::KeyValue> keys_;
};

class LeaderElectionFakeEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(static_cast<etcdserverpb::Auth::Service*>(&etcd_));
    builder.RegisterService(static_cast<etcdserverpb::Lease::Service*>(&etcd_));
    builder.RegisterService(static_cast<etcdserverpb::KV::Service*>(&etcd_));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    EtcdOptions options;
    options.endpoints = {absl::StrCat("127.0.0.1:", port)};
    options.user = "coordinator";
    options.password = "wrong";
    options.prefix = "/p/";
    LeaderElectionOptions election;
    election.identity = "10.0.0.5:7070";
    election.ttl = kTtl;
    election.refusal_seed = 7;
    election.clock = &clock_;
    election.on_change = [this](bool leader) {
      std::lock_guard<std::mutex> lock(changes_mu_);
      changes_.push_back(leader);
    };
    absl::StatusOr<std::unique_ptr<LeaderElection>> created =
        LeaderElection::Create(options, election);
    ASSERT_TRUE(created.ok()) << created.status();
    election_ = std::move(*created);
  }

  void TearDown() override {
    election_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  // Rounds until their pauses add up to `span`, the clock advanced by each;
  // the pauses asked for.
  std::vector<absl::Duration> RoundsFor(absl::Duration span) {
    std::vector<absl::Duration> pauses;
    for (absl::Duration elapsed; elapsed < span;) {
      pauses.push_back(election_->Round());
      clock_.Advance(pauses.back());
      elapsed += pauses.back();
    }
    return pauses;
  }

  std::vector<bool> changes() {
    std::lock_guard<std::mutex> lock(changes_mu_);
    return changes_;
  }

  // The tick is ttl/5.
  static constexpr absl::Duration kTtl = absl::Seconds(5);
  static constexpr absl::Duration kTick = absl::Seconds(1);

  FakeEtcd etcd_;
  FakeClock clock_;  // the lease's; outlives election_
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<LeaderElection> election_;
  std::mutex changes_mu_;
  std::vector<bool> changes_;
};

// The bound on rounds over `span` when each pause doubles from half a tick
// (the jitter's least factor) and stays at half of kMaxRefusalPause or more
// once it gets there: logarithmic until the cap, then span / 15 s.
int MaxRefusedRounds(absl::Duration tick, absl::Duration span) {
  int rounds = 0;
  absl::Duration elapsed;
  for (absl::Duration least = tick / 2; elapsed < span; ++rounds) {
    elapsed += least;
    least = std::min(least * 2, kMaxRefusalPause / 2);
  }
  return rounds;
}

// The election's WARNING lines in a captured log (common/logging writes
// "W hh:mm:ss file:line] message").
int ElectionWarnings(absl::string_view log) {
  int n = 0;
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StartsWith(line, "W ") && absl::StrContains(line, "election /p/leader")) ++n;
  }
  return n;
}

// A wrong password: every login is refused the same. Ten minutes of rounds
// sent 600 logins (one a tick); now a handful, and the pauses double up to
// kMaxRefusalPause. Once etcd takes the login the next round campaigns and
// wins, and the pause is the tick again.
TEST_F(LeaderElectionFakeEtcdTest, Round_LoginRefused_BacksOffThenLeadsOnceAccepted) {
  etcd_.RefuseLogins(true);
  ::testing::internal::CaptureStderr();
  const std::vector<absl::Duration> minute = RoundsFor(absl::Minutes(1));
  EXPECT_LE(static_cast<int>(minute.size()), MaxRefusedRounds(kTick, absl::Minutes(1)));
  EXPECT_LE(static_cast<int>(minute.size()), 8);  // 60 a tick apart before
  const std::vector<absl::Duration> rest = RoundsFor(absl::Minutes(9));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(testing::LinesWith(log, "etcd refuses 10.0.0.5:7070"), 1) << log;
  EXPECT_EQ(testing::LinesWith(log, "cannot get a lease"), kElectionFailureLogBurst) << log;
  EXPECT_EQ(etcd_.logins(), static_cast<int>(minute.size() + rest.size()));
  EXPECT_LE(etcd_.logins(), MaxRefusedRounds(kTick, absl::Minutes(10)));
  for (absl::Duration pause : rest) {
    EXPECT_GT(pause, kMaxRefusalPause / 2);
    EXPECT_LE(pause, kMaxRefusalPause);
  }
  EXPECT_EQ(election_->Refusal().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(election_->Refusal().message(), HasSubstr("logging in as coordinator"));
  EXPECT_FALSE(election_->IsLeader());

  etcd_.RefuseLogins(false);
  EXPECT_EQ(election_->Round(), kTick);
  EXPECT_TRUE(election_->IsLeader());
  EXPECT_EQ(election_->Refusal(), absl::OkStatus());
  EXPECT_EQ(changes(), std::vector<bool>({true}));
  EXPECT_EQ(election_->Resign(), absl::OkStatus());
  EXPECT_EQ(changes(), std::vector<bool>({true, false}));
}

// A user without write on the prefix: the login and the lease work, the
// campaign's Txn is refused PERMISSION_DENIED every time.
TEST_F(LeaderElectionFakeEtcdTest, Round_CampaignDenied_BacksOffThenLeadsOnceAllowed) {
  etcd_.RefuseTxns(true);
  const std::vector<absl::Duration> pauses = RoundsFor(absl::Minutes(10));
  EXPECT_EQ(etcd_.txns(), static_cast<int>(pauses.size()));
  EXPECT_LE(etcd_.txns(), MaxRefusedRounds(kTick, absl::Minutes(10)));
  for (size_t i = 1; i < pauses.size() && pauses[i - 1] < kMaxRefusalPause / 2; ++i) {
    EXPECT_GT(pauses[i], pauses[i - 1]) << "round " << i;  // doubling beats the jitter
  }
  EXPECT_EQ(election_->Refusal().code(), absl::StatusCode::kPermissionDenied);

  etcd_.RefuseTxns(false);
  EXPECT_EQ(election_->Round(), kTick);
  EXPECT_TRUE(election_->IsLeader());
  EXPECT_EQ(election_->Refusal(), absl::OkStatus());
}

// Pauses past the TTL: the follower's lease lapses between rounds and each
// round takes a new one. That is expected and logs nothing (it logged a
// warning every round, outside the rate limiter); the rounds' warnings are
// the failed campaigns, within the burst (the limiter keeps real time, of
// which the rounds take far less than its minute).
TEST_F(LeaderElectionFakeEtcdTest, Round_CampaignDeniedPastTheTtl_LeaseLapsesUnlogged) {
  etcd_.RefuseTxns(true);
  ::testing::internal::CaptureStderr();
  int lapses = 0;  // pauses past the TTL with a round after them
  absl::Duration pause;
  for (int i = 0; i < 20; ++i) {
    lapses += pause > kTtl;
    pause = election_->Round();
    clock_.Advance(pause);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(lapses, 14);
  EXPECT_EQ(etcd_.leases(), 1 + lapses);  // the first, and one after each lapse
  EXPECT_EQ(testing::LinesWith(log, "was not renewed"), 0) << log;
  EXPECT_EQ(testing::LinesWith(log, "campaign failed"), kElectionFailureLogBurst) << log;
  EXPECT_EQ(ElectionWarnings(log), kElectionFailureLogBurst) << log;
  EXPECT_EQ(testing::LinesWith(log, "etcd refuses 10.0.0.5:7070"), 1) << log;
  EXPECT_FALSE(election_->IsLeader());
}

// etcd unavailable (no quorum, a restart) is no refusal: a round a tick,
// as before, so a follower takes over promptly once etcd is back. Its
// warnings are rate-limited: the burst within the minute, no more.
TEST_F(LeaderElectionFakeEtcdTest, Round_EtcdUnavailable_KeepsTheTickAndLogsABurst) {
  etcd_.FailLoginsTransiently(true);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(election_->Round(), kTick) << "round " << i;
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(testing::LinesWith(log, "cannot get a lease"), kElectionFailureLogBurst) << log;
  EXPECT_EQ(testing::LinesWith(log, "etcd refuses"), 0) << log;
  EXPECT_EQ(election_->Refusal(), absl::OkStatus());
  etcd_.FailLoginsTransiently(false);
  EXPECT_EQ(election_->Round(), kTick);
  EXPECT_TRUE(election_->IsLeader());
}

// The refusal pause: tick * 2^(n-1) up to kMaxRefusalPause, scaled by a
// factor in (0.5, 1] that the seed decides.
TEST(ElectionRefusalPauseTest, ElectionRefusalPause_DoublesToTheCap_JitterFromTheSeed) {
  const absl::Duration tick = absl::Seconds(1);
  for (int n = 1; n <= 70; ++n) {
    const absl::Duration full =
        std::min(tick * (n <= 20 ? 1 << (n - 1) : 1 << 20), kMaxRefusalPause);
    const absl::Duration pause = ElectionRefusalPause(tick, n, 42);
    EXPECT_GT(pause, full / 2) << n;
    EXPECT_LE(pause, full) << n;
    EXPECT_EQ(pause, ElectionRefusalPause(tick, n, 42)) << n;
  }
  int differ = 0;
  for (int n = 1; n <= 10; ++n) {
    differ += ElectionRefusalPause(tick, n, 1) != ElectionRefusalPause(tick, n, 2);
  }
  EXPECT_GE(differ, 8);
}

TEST(ElectionRefusalPauseTest, IsEtcdRefusal_OnlyWhatARetryMeetsAgain) {
  EXPECT_TRUE(IsEtcdRefusal(absl::UnauthenticatedError("wrong password")));
  EXPECT_TRUE(IsEtcdRefusal(absl::PermissionDeniedError("no write on the prefix")));
  EXPECT_TRUE(IsEtcdRefusal(absl::InvalidArgumentError("too many operations")));
  EXPECT_FALSE(IsEtcdRefusal(absl::UnavailableError("no leader")));
  EXPECT_FALSE(IsEtcdRefusal(absl::NotFoundError("lease")));
  EXPECT_FALSE(IsEtcdRefusal(absl::OkStatus()));
}

}  // namespace
}  // namespace pipetrain
