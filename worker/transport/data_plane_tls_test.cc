// The data plane over TLS (the worker's --data-tls-*): two stages whose
// servers require client certificates signed by the cluster's CA and whose
// transports present theirs. A tensor crosses bitwise; a sender without a
// certificate, with one of another CA, or in plaintext delivers nothing;
// the checked server name is the configured one.
#include "worker/transport/data_plane_tls.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/data_plane_keys.h"
#include "common/testing/test_certificates.h"
#include "common/tls_credentials.h"
#include "gtest/gtest.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/grpc_transport.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(60);  // Deadlines only; never waited out.
// How long a refused sender keeps trying to connect: its Send then fails.
constexpr absl::Duration kRefusedConnectTimeout = absl::Seconds(3);
constexpr char kJob[] = "j-tls";

DataPlaneKeys KeysOf(int worker) { return DeriveDataPlaneKeys("tls-secret", kJob, 2)[worker]; }

TensorAddress Address(int micro_batch) {
  return {kJob, /*iteration=*/1, v1::TENSOR_KIND_ACTIVATION, micro_batch, /*unit=*/0};
}

class DataPlaneTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("TEST_TMPDIR");
    absl::StatusOr<testing::TestCertificates> made =
        testing::MakeTestCertificates(dir != nullptr ? dir : "/tmp");
    ASSERT_TRUE(made.ok()) << made.status();
    certificates_ = new testing::TestCertificates(*made);
  }
  static void TearDownTestSuite() {
    delete certificates_;
    certificates_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(certificates_, nullptr);
    const testing::TestCertificates& c = *certificates_;
    absl::StatusOr<DataPlaneTls> tls = DataPlaneTlsFromFlags(c.server_cert, c.server_key, c.ca, "");
    ASSERT_TRUE(tls.ok()) << tls.status();
    ASSERT_TRUE(tls->enabled());
    worker_tls_ = *tls;
    for (int s = 0; s < 2; ++s) {
      mailboxes_[s] = std::make_unique<Mailbox>();
      absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
          DataPlaneServer::Start("127.0.0.1:0", mailboxes_[s].get(), nullptr, {}, tls->server);
      ASSERT_TRUE(server.ok()) << server.status();
      servers_[s] = *std::move(server);
      servers_[s]->SetJob(kJob, 2, KeysOf(s).receive_key);
      addresses_.push_back(servers_[s]->address());
    }
  }

  void TearDown() override {
    for (auto& t : transports_) {
      if (t != nullptr) t->Shutdown();
    }
    for (auto& s : servers_) {
      if (s != nullptr) s->Shutdown();
    }
    for (auto& m : mailboxes_) {
      if (m != nullptr) m->Shutdown();
    }
  }

  // Stage `stage`'s transport with `credentials` (null: plaintext).
  GrpcTransport& Transport(int stage, std::shared_ptr<grpc::ChannelCredentials> credentials,
                           const std::string& server_name = "",
                           absl::Duration connect_timeout = kPatience) {
    GrpcTransportOptions options;
    options.credential = {kJob, KeysOf(stage).send_keys};
    options.connect_timeout = connect_timeout;
    options.channel_credentials = std::move(credentials);
    options.tls_server_name = server_name;
    transports_[stage] =
        std::make_unique<GrpcTransport>(stage, addresses_, mailboxes_[stage].get(), options);
    return *transports_[stage];
  }

  static std::shared_ptr<grpc::ChannelCredentials> ClientTls(const std::string& ca,
                                                             const std::string& cert,
                                                             const std::string& key) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls = ClientTlsCredentials(
        ca, cert, key, {"data-tls-ca", "data-tls-cert", "data-tls-key", "the peers"});
    EXPECT_TRUE(tls.ok()) << tls.status();
    return tls.ok() ? *tls : nullptr;
  }

  // A worker's own credentials (its --data-tls-*): the CA, and the
  // certificate its server presents, as a client's.
  std::shared_ptr<grpc::ChannelCredentials> WorkerTls() { return worker_tls_.channel; }

  // Stage 0 sends micro-batch `mb` to stage 1: whether stage 1 got it
  // bitwise (the send's error otherwise, or a receive deadline for a
  // tensor that was never delivered).
  absl::Status SendAndReceive(GrpcTransport& sender, int mb, absl::Duration recv_timeout) {
    const Tensor sent = Tensor::Filled({64, 32}, 0.25f + mb);
    absl::Status send = sender.Send(1, Address(mb), sent);
    if (!send.ok()) return send;
    absl::StatusOr<Tensor> got = mailbox_transport().Recv(0, Address(mb), recv_timeout);
    if (!got.ok()) return got.status();
    if (got->ToVector() != sent.ToVector()) return absl::InternalError("tensor changed");
    return absl::OkStatus();
  }

  // Stage 1's receiving side (a transport that only receives).
  GrpcTransport& mailbox_transport() {
    if (transports_[1] == nullptr) Transport(1, WorkerTls());
    return *transports_[1];
  }

  static testing::TestCertificates* certificates_;
  DataPlaneTls worker_tls_;
  std::unique_ptr<Mailbox> mailboxes_[2];
  std::unique_ptr<DataPlaneServer> servers_[2];
  std::vector<std::string> addresses_;
  std::unique_ptr<GrpcTransport> transports_[2];
};

testing::TestCertificates* DataPlaneTlsTest::certificates_ = nullptr;

TEST_F(DataPlaneTlsTest, BothSidesWithTheClustersCertificates_TensorsArriveBitwise) {
  GrpcTransport& sender = Transport(0, WorkerTls());
  for (int mb = 0; mb < 3; ++mb) {
    const absl::Status delivered = SendAndReceive(sender, mb, kPatience);
    EXPECT_TRUE(delivered.ok()) << delivered;
  }
}

// The refused senders below try for kRefusedConnectTimeout; whatever gRPC
// reports (a failed connection, or a stream the server ends), the tensor
// never reaches the receiver.
void ExpectNotDelivered(const absl::Status& status) {
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
}

TEST_F(DataPlaneTlsTest, SenderWithoutCertificate_DeliversNothing) {
  const testing::TestCertificates& c = *certificates_;
  GrpcTransport& sender = Transport(0, ClientTls(c.ca, "", ""), "", kRefusedConnectTimeout);
  ExpectNotDelivered(SendAndReceive(sender, 0, kRefusedConnectTimeout));
}

// A refused handshake fails the send naming what both ends must agree on.
TEST_F(DataPlaneTlsTest, SenderTrustingAnotherCa_SendFailsNamingTheTlsFlags) {
  const testing::TestCertificates& c = *certificates_;
  GrpcTransport& sender =
      Transport(0, ClientTls(c.other_ca, c.server_cert, c.server_key), "", kRefusedConnectTimeout);
  const absl::Status sent = sender.Send(1, Address(0), Tensor::Filled({4}, 1.f));
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_NE(sent.message().find("or the TLS handshake failed"), std::string::npos) << sent;
  EXPECT_NE(sent.message().find("--data-tls-ca"), std::string::npos) << sent;
}

TEST_F(DataPlaneTlsTest, SenderWithAnotherCasCertificate_DeliversNothing) {
  const testing::TestCertificates& c = *certificates_;
  GrpcTransport& sender =
      Transport(0, ClientTls(c.ca, c.other_ca, c.other_key), "", kRefusedConnectTimeout);
  ExpectNotDelivered(SendAndReceive(sender, 0, kRefusedConnectTimeout));
}

TEST_F(DataPlaneTlsTest, PlaintextSender_DeliversNothing) {
  GrpcTransport& sender = Transport(0, nullptr, "", kRefusedConnectTimeout);
  ExpectNotDelivered(SendAndReceive(sender, 0, kRefusedConnectTimeout));
}

TEST_F(DataPlaneTlsTest, SenderTrustingAnotherCa_RefusesTheServer) {
  const testing::TestCertificates& c = *certificates_;
  GrpcTransport& sender =
      Transport(0, ClientTls(c.other_ca, c.server_cert, c.server_key), "", kRefusedConnectTimeout);
  ExpectNotDelivered(SendAndReceive(sender, 0, kRefusedConnectTimeout));
}

// The peers' certificate names localhost and 127.0.0.1: checked for
// "localhost" the connection holds; for a name it lacks, it fails.
TEST_F(DataPlaneTlsTest, ServerName_CheckedAsConfigured) {
  const absl::Status named = SendAndReceive(Transport(0, WorkerTls(), "localhost"), 0, kPatience);
  EXPECT_TRUE(named.ok()) << named;
  transports_[0]->Shutdown();
  ExpectNotDelivered(
      SendAndReceive(Transport(0, WorkerTls(), "pipetrain-worker", kRefusedConnectTimeout), 1,
                     kRefusedConnectTimeout));
}

TEST_F(DataPlaneTlsTest, Flags_NoneIsPlaintextPartialOrBadNameRefusedNamingTheFlag) {
  const testing::TestCertificates& c = *certificates_;
  absl::StatusOr<DataPlaneTls> none = DataPlaneTlsFromFlags("", "", "", "");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->enabled());
  EXPECT_EQ(none->channel, nullptr);
  const struct {
    std::string cert, key, ca, name, fragment;
  } bad[] = {
      {c.server_cert, c.server_key, "", "",
       "--data-tls-cert, --data-tls-key and --data-tls-ca go "
       "together"},
      {"", "", c.ca, "", "go together"},
      {"", "", "", "localhost", "--data-tls-server-name names the peers' certificates"},
      {c.server_cert, c.server_key, c.ca, "bad name!",
       "--data-tls-server-name \"bad name!\" is "
       "not a server name"},
      {c.server_cert, c.server_key, c.ca, std::string(254, 'a'), "1 to 253 characters"},
      {c.server_cert, c.client_key, c.ca, "", "--data-tls-key"},  // not the certificate's key
  };
  for (const auto& b : bad) {
    const absl::Status s = DataPlaneTlsFromFlags(b.cert, b.key, b.ca, b.name).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.fragment << ": " << s;
    EXPECT_NE(s.message().find(b.fragment), std::string::npos) << s;
  }
  const absl::Status missing =
      DataPlaneTlsFromFlags(c.server_cert, c.server_key, "/no/such/ca.pem", "").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("--data-tls-ca: cannot read /no/such/ca.pem"), std::string::npos)
      << missing;
  absl::StatusOr<DataPlaneTls> named =
      DataPlaneTlsFromFlags(c.server_cert, c.server_key, c.ca, "pipetrain-worker.default.svc");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->server_name, "pipetrain-worker.default.svc");
}

}  // namespace
}  // namespace pipetrain
