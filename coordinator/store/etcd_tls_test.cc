// The etcd backend over TLS, against a real etcd started by the test with
// certificates the test makes (openssl): an etcd that requires client
// certificates (--client-cert-auth) serves a store and an election given
// its CA and a client certificate it trusts, and refuses, without a byte of
// state passing, a client that brings no certificate, speaks plaintext, or
// trusts another CA. Then etcd's own auth over TLS: a user with a password
// logs in, works within its prefix and logs in again after etcd restarts;
// a wrong password, no user, and a key outside the prefix are refused.
//
// No sleeps for synchronisation: waits poll a condition until a deadline.
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <sys/stat.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/tls_credentials.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/etcd_store.h"
#include "coordinator/store/etcd_testing.h"
#include "coordinator/store/leader_election.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/etcd/rpc.grpc.pb.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& ca,
                                                      const std::string& cert = "",
                                                      const std::string& key = "") {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> made =
      ClientTlsCredentials(ca, cert, key, {"etcd-ca", "etcd-cert", "etcd-key", "etcd"});
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *made : nullptr;
}

// An election over `options` alone: it leads (a lease granted and kept,
// the leader key written), then resigns (the lease revoked).
void ExpectElectionLeadsAndResigns(const EtcdOptions& options) {
  LeaderElectionOptions election_options;
  election_options.identity = "10.0.0.1:7070";
  election_options.ttl = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<LeaderElection>> election =
      LeaderElection::Create(options, election_options);
  ASSERT_TRUE(election.ok()) << election.status();
  ASSERT_EQ((*election)->Start(), absl::OkStatus());
  EXPECT_TRUE(EtcdWaitFor([&] { return (*election)->IsLeader(); }, absl::Seconds(20)));
  EXPECT_EQ((*election)->Resign(), absl::OkStatus());
}

// One TLS etcd requiring client certificates, for every test here.
class EtcdTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<EtcdTestCertificates> made = MakeEtcdTestCertificates(EtcdTestTmpDir());
    ASSERT_TRUE(made.ok()) << made.status();
    certificates_ = new EtcdTestCertificates(*made);
    EtcdServerTls tls;
    tls.cert_file = made->server_cert;
    tls.key_file = made->server_key;
    tls.client_ca_file = made->ca;
    tls.probe_credentials = Credentials(made->ca, made->client_cert, made->client_key);
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("tls", tls);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = etcd->release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    delete certificates_;
    certificates_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(etcd_, nullptr) << "no TLS etcd (see the suite's set-up)"; }

  // Options for `prefix` with `credentials` (null: plaintext).
  static EtcdOptions OptionsWith(const std::string& prefix,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials) {
    EtcdOptions options = etcd_->Options(prefix);
    options.credentials = std::move(credentials);
    options.rpc_timeout = absl::Seconds(3);
    return options;
  }

  static EtcdTestCertificates* certificates_;
  static EtcdProcess* etcd_;
};

EtcdTestCertificates* EtcdTlsTest::certificates_ = nullptr;
EtcdProcess* EtcdTlsTest::etcd_ = nullptr;

TEST_F(EtcdTlsTest, MutualTls_StoreCommitsAndReadsAndElectionLeads) {
  const EtcdTestCertificates& c = *certificates_;
  EtcdOptions options = OptionsWith("/mtls/", Credentials(c.ca, c.client_cert, c.client_key));
  // Written as an https URL: the scheme agrees with the credentials.
  options.endpoints = {"https://" + etcd_->endpoint()};
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->Commit({StoreWrite::Put("jobs/a", "spec-a")}), absl::OkStatus());
  absl::StatusOr<std::optional<std::string>> read = (*store)->Get("jobs/a");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->value_or("(none)"), "spec-a");

  ExpectElectionLeadsAndResigns(options);
}

// A user and password for an etcd whose auth is off (this one's): calls go
// without a login rather than fail, as etcd's own client does.
TEST_F(EtcdTlsTest, PasswordGivenButEtcdAuthOff_CallsGoWithoutLogin) {
  const EtcdTestCertificates& c = *certificates_;
  EtcdOptions options = OptionsWith("/auth-off/", Credentials(c.ca, c.client_cert, c.client_key));
  options.user = "pipetrain";
  options.password = "unused";
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->Commit({StoreWrite::Put("k", "v")}), absl::OkStatus());
  ASSERT_EQ((*store)->Commit({StoreWrite::Put("k2", "v2")}), absl::OkStatus());
  absl::StatusOr<std::optional<std::string>> read = (*store)->Get("k2");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->value_or("(none)"), "v2");
}

// Each refused client fails UNAVAILABLE naming the endpoint, and leaves
// nothing behind (the mutual-TLS client reads no key of its prefix).
TEST_F(EtcdTlsTest, NoClientCertificatePlaintextOrAnotherCa_Refused) {
  const EtcdTestCertificates& c = *certificates_;
  struct Case {
    const char* name;
    const char* prefix;
    std::shared_ptr<grpc::ChannelCredentials> credentials;
  };
  const Case cases[] = {
      {"no client certificate", "/refused-no-cert/", Credentials(c.ca)},
      {"plaintext", "/refused-plaintext/", nullptr},
      {"another CA", "/refused-other-ca/", Credentials(c.other_ca, c.client_cert, c.client_key)},
  };
  for (const Case& refused : cases) {
    SCOPED_TRACE(refused.name);
    const std::string prefix = refused.prefix;
    absl::StatusOr<std::unique_ptr<EtcdClient>> client =
        EtcdClient::Create(OptionsWith(prefix, refused.credentials));
    ASSERT_TRUE(client.ok()) << client.status();
    etcdserverpb::TxnRequest txn;
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(prefix + "k");
    put->set_value("v");
    etcdserverpb::TxnResponse response;
    const absl::Status status = (*client)->Txn(txn, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr(etcd_->endpoint()));
    // What TLS adds to check, or that etcd may want it.
    EXPECT_THAT(status.message(), HasSubstr(refused.credentials != nullptr
                                                ? "over TLS (--etcd-ca) also that this CA"
                                                : "if etcd serves TLS (https client URLs)"));

    absl::StatusOr<std::unique_ptr<EtcdStore>> trusted =
        EtcdStore::Open(OptionsWith(prefix, Credentials(c.ca, c.client_cert, c.client_key)));
    ASSERT_TRUE(trusted.ok()) << trusted.status();
    absl::StatusOr<std::optional<std::string>> read = (*trusted)->Get("k");
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, std::nullopt);
  }
}

// The scheme of an endpoint must agree with the credentials.
TEST(EtcdTlsOptionsTest, SchemeAndCredentialsDisagree_InvalidArgument) {
  EtcdOptions options;
  options.endpoints = {"https://127.0.0.1:2379"};
  EXPECT_THAT(CheckEtcdOptions(options).message(),
              HasSubstr("is https but no TLS is configured; give etcd's CA (--etcd-ca)"));
  options.endpoints = {"http://127.0.0.1:2379"};
  options.credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
  EXPECT_THAT(CheckEtcdOptions(options).message(), HasSubstr("is http but TLS is configured"));
  options.endpoints = {"127.0.0.1:2379", "https://127.0.0.2:2379"};
  EXPECT_EQ(CheckEtcdOptions(options), absl::OkStatus());
  options.endpoints = {"HTTPS://127.0.0.1:2379"};  // schemes ignore case
  EXPECT_EQ(CheckEtcdOptions(options), absl::OkStatus());
  options.endpoints = {"unixetcd-0:2379"};  // a host name, not a socket
  EXPECT_EQ(CheckEtcdOptions(options), absl::OkStatus());
  options.endpoints = {"unix:/run/etcd.sock"};
  EXPECT_THAT(CheckEtcdOptions(options).message(), HasSubstr("unix sockets are not supported"));
  options.endpoints = {"dns://h:2379"};
  EXPECT_THAT(CheckEtcdOptions(options).message(),
              HasSubstr("only http:// and https:// are understood"));
}

// ---------------------------------------------------------------------------
// etcd's own auth: users with passwords, over TLS (server certificate only).

constexpr char kAuthPrefix[] = "/auth/";
constexpr char kUser[] = "pipetrain";
constexpr char kPassword[] = "correct horse";

class EtcdAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = absl::StrCat(EtcdTestTmpDir(), "/auth-certs");
    mkdir(dir.c_str(), 0700);
    absl::StatusOr<EtcdTestCertificates> made = MakeEtcdTestCertificates(dir);
    ASSERT_TRUE(made.ok()) << made.status();
    ca_ = new std::string(made->ca);
    certificates_ = new EtcdTestCertificates(*made);
    EtcdServerTls tls;
    tls.cert_file = made->server_cert;
    tls.key_file = made->server_key;
    tls.probe_credentials = Credentials(made->ca);
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("auth", tls);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = etcd->release();
    const absl::Status enabled =
        EnableEtcdAuth(etcd_->endpoint(), Credentials(made->ca), kAuthPrefix, kUser, kPassword);
    ASSERT_EQ(enabled, absl::OkStatus());
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    delete ca_;
    ca_ = nullptr;
    delete certificates_;
    certificates_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(etcd_, nullptr) << "no etcd with auth (see the set-up)"; }

  static EtcdOptions AsUser(const std::string& user, const std::string& password) {
    EtcdOptions options = etcd_->Options(kAuthPrefix);
    options.credentials = Credentials(*ca_);
    options.user = user;
    options.password = password;
    options.rpc_timeout = absl::Seconds(3);
    return options;
  }

  static std::string* ca_;
  static EtcdTestCertificates* certificates_;
  static EtcdProcess* etcd_;
};

std::string* EtcdAuthTest::ca_ = nullptr;
EtcdTestCertificates* EtcdAuthTest::certificates_ = nullptr;
EtcdProcess* EtcdAuthTest::etcd_ = nullptr;

// An etcd member that has lost its raft leader, as etcd answers then: a
// call with the metadata "hasleader: true" is refused at once (UNAVAILABLE
// "etcdserver: no leader"); one without it (a login waits for a
// linearizable read) is held until its deadline.
bool AskedForALeader(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("hasleader");
  return it != metadata.end() && it->second == "true";
}
grpc::Status LeaderlessAnswer(grpc::ServerContext* context) {
  if (AskedForALeader(*context)) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "etcdserver: no leader");
  }
  while (!context->IsCancelled() && std::chrono::system_clock::now() < context->deadline()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // etcd's wait, not a sync
  }
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "context deadline exceeded");
}
class LeaderlessAuth final : public etcdserverpb::Auth::Service {
  grpc::Status Authenticate(grpc::ServerContext* context, const etcdserverpb::AuthenticateRequest*,
                            etcdserverpb::AuthenticateResponse*) override {
    return LeaderlessAnswer(context);
  }
};
class LeaderlessKv final : public etcdserverpb::KV::Service {
  grpc::Status Range(grpc::ServerContext* context, const etcdserverpb::RangeRequest*,
                     etcdserverpb::RangeResponse*) override {
    return LeaderlessAnswer(context);
  }
};

// A store opened (a newly elected coordinator's) while the first endpoint
// is a member without a leader: the login there went without "hasleader",
// was held for the whole rpc_timeout, and Open failed UNAVAILABLE instead
// of going on to the healthy member.
TEST_F(EtcdAuthTest, LoginAtAMemberWithoutALeader_GoesOnToTheNext) {
  LeaderlessAuth auth;
  LeaderlessKv kv;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
      ServerTlsCredentials(certificates_->server_cert, certificates_->server_key, "");
  ASSERT_TRUE(tls.ok()) << tls.status();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *tls, &port);
  builder.RegisterService(&auth);
  builder.RegisterService(&kv);
  std::unique_ptr<grpc::Server> member = builder.BuildAndStart();
  ASSERT_NE(member, nullptr);
  EtcdOptions options = AsUser(kUser, kPassword);
  options.endpoints.insert(options.endpoints.begin(), absl::StrCat("127.0.0.1:", port));
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Commit({StoreWrite::Put("jobs/leaderless", "1")}), absl::OkStatus());
  member->Shutdown();
}

// Logged in, the store and the election work within the user's prefix;
// after etcd restarts (its tokens gone) the client logs in again by itself.
TEST_F(EtcdAuthTest, Password_StoreAndElectionWork_AndLoginRenewedAfterEtcdRestart) {
  const EtcdOptions options = AsUser(kUser, kPassword);
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->Commit({StoreWrite::Put("jobs/a", "1")}), absl::OkStatus());
  ExpectElectionLeadsAndResigns(options);

  ASSERT_EQ(etcd_->Restart(), absl::OkStatus());
  absl::Status after = absl::UnknownError("not tried");
  EtcdWaitFor(
      [&] {
        after = (*store)->Commit({StoreWrite::Put("jobs/b", "2")});
        return after.ok();
      },
      absl::Seconds(30));
  EXPECT_EQ(after, absl::OkStatus());
  absl::StatusOr<std::optional<std::string>> read = (*store)->Get("jobs/a");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->value_or("(none)"), "1");
}

// A wrong password, no user at all, and a key outside the user's
// permission: each refused, naming what to check.
TEST_F(EtcdAuthTest, WrongPasswordNoUserOrOutsideThePrefix_Refused) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> wrong =
      EtcdClient::Create(AsUser(kUser, "wrong password"));
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  etcdserverpb::RangeRequest range;
  range.set_key(absl::StrCat(kAuthPrefix, "k"));
  etcdserverpb::RangeResponse response;
  absl::Status status = (*wrong)->Range(range, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(status.message(), HasSubstr("logging in as pipetrain"));
  EXPECT_THAT(status.message(), HasSubstr("--etcd-password-file"));

  absl::StatusOr<std::unique_ptr<EtcdClient>> anonymous = EtcdClient::Create(AsUser("", ""));
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  status = (*anonymous)->Range(range, &response);
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnauthenticated ||
              status.code() == absl::StatusCode::kPermissionDenied)
      << status;
  EXPECT_THAT(status.message(), HasSubstr("etcd has auth enabled"));

  absl::StatusOr<std::unique_ptr<EtcdClient>> user = EtcdClient::Create(AsUser(kUser, kPassword));
  ASSERT_TRUE(user.ok()) << user.status();
  range.set_key("/elsewhere/k");
  status = (*user)->Range(range, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), HasSubstr("read and write on the prefix's keys"));
}

TEST(EtcdAuthOptionsTest, UserWithoutPassword_InvalidArgument) {
  EtcdOptions options;
  options.endpoints = {"127.0.0.1:2379"};
  options.user = "pipetrain";
  EXPECT_THAT(CheckEtcdOptions(options).message(), HasSubstr("user and password go together"));
  options.user = "";
  options.password = "p";
  EXPECT_THAT(CheckEtcdOptions(options).message(), HasSubstr("user and password go together"));
}

}  // namespace
}  // namespace pipetrain
