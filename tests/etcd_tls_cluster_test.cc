// Highly available coordinators whose etcd requires TLS client certificates
// (etcd --client-cert-auth), end to end through the real binaries: a
// coordinator given etcd's CA and a client certificate (--etcd-ca,
// --etcd-cert, --etcd-key) leads, keeps a job's state in etcd and trains
// it, and exports the expiry of those files; one without a client
// certificate never leads, and its log says why. Then etcd's own auth: a
// coordinator logging in with a user and password leads and trains. The
// test makes the certificates (openssl) and starts the etcds; every process
// is killed at the end. Waits poll an observable condition until a deadline.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "common/tls_credentials.h"
#include "coordinator/store/etcd_client.h"
#include "coordinator/store/etcd_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

constexpr absl::Duration kJobTimeout = absl::Seconds(120);

std::string TestDir(const std::string& name) {
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string dir =
      absl::StrCat(outputs != nullptr ? outputs : std::getenv("TEST_TMPDIR"), "/", name);
  mkdir(dir.c_str(), 0700);
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The cluster's one worker is READY, which it is once the coordinator
// leads (a follower refuses registrations): polls a remote state.
bool AwaitOneReadyWorker(v1::CoordinatorService::Stub& stub) {
  return EtcdWaitFor(
      [&] {
        auto context = std::make_unique<grpc::ClientContext>();
        context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::ListWorkersResponse workers;
        if (!stub.ListWorkers(context.get(), {}, &workers).ok()) return false;
        return workers.workers_size() == 1 && workers.workers(0).state() == v1::WORKER_STATE_READY;
      },
      absl::Seconds(60));
}

TEST(EtcdTlsClusterTest, ClientCertificateLeadsAndTrains_WithoutOneNeverLeads) {
  // In the test's scratch space, not its kept outputs: they hold keys.
  const std::string cert_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/certs");
  mkdir(cert_dir.c_str(), 0700);
  absl::StatusOr<EtcdTestCertificates> certs = MakeEtcdTestCertificates(cert_dir);
  ASSERT_TRUE(certs.ok()) << certs.status();
  EtcdServerTls tls;
  tls.cert_file = certs->server_cert;
  tls.key_file = certs->server_key;
  tls.client_ca_file = certs->ca;
  // The readiness probe's credentials: the coordinator's own files.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> probe =
      ClientTlsCredentials(certs->ca, certs->client_cert, certs->client_key);
  ASSERT_TRUE(probe.ok()) << probe.status();
  tls.probe_credentials = *probe;
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("tls-cluster", tls);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string endpoint = "https://" + (*etcd)->endpoint();

  const std::vector<std::string> etcd_flags = {
      "--etcd-endpoints=" + endpoint, "--etcd-ca=" + certs->ca, "--etcd-cert=" + certs->client_cert,
      "--etcd-key=" + certs->client_key, "--leader-lease-seconds=2"};
  std::unique_ptr<LocalCluster> cluster =
      testing::StartTestCluster("etcd-tls", /*workers=*/1, etcd_flags);
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  ASSERT_TRUE(AwaitOneReadyWorker(*stub))
      << "no READY worker behind a leading coordinator within 60 s";
  const std::string id = testing::SubmitJob(*stub, testing::TinyJobSpec(/*steps=*/3));
  const v1::Job job = testing::AwaitJob(*stub, id, kJobTimeout, testing::Ended);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  // The job's record is in etcd, under the coordinator's prefix.
  {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client =
        EtcdClient::Create((*etcd)->Options("/pipetrain/"));
    ASSERT_TRUE(client.ok()) << client.status();
    etcdserverpb::RangeRequest range;
    range.set_key("/pipetrain/");
    range.set_range_end(EtcdPrefixEnd("/pipetrain/"));
    range.set_keys_only(true);
    etcdserverpb::RangeResponse response;
    ASSERT_EQ((*client)->Range(range, &response), absl::OkStatus());
    bool found = false;
    for (const mvccpb::KeyValue& kv : response.kvs()) found |= absl::StrContains(kv.key(), id);
    EXPECT_TRUE(found) << response.kvs_size() << " keys, none naming " << id;
  }
  // The files reaching etcd have expiry gauges (the alert covers them).
  const std::string metrics = testing::ScrapeMetrics(cluster->http_port());
  EXPECT_TRUE(absl::StrContains(
      metrics, "pipetrain_tls_certificate_expiry_timestamp_seconds{flag=\"etcd-cert\"}"))
      << metrics.substr(0, 2000);
  EXPECT_TRUE(absl::StrContains(
      metrics, "pipetrain_tls_certificate_expiry_timestamp_seconds{flag=\"etcd-ca\"}"));

  // Without a client certificate: etcd refuses every call, so it campaigns
  // on and never leads; its log names the endpoint it cannot use.
  const std::string dir = TestDir("no-client-cert");
  const std::string log = dir + "/coordinator.log";
  absl::StatusOr<Subprocess> refused = Subprocess::Spawn(
      {FindSiblingBinary("coordinator", "pipetrain-coordinator").value(), "--insecure",
       "--grpc-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--etcd-endpoints=" + endpoint,
       "--etcd-ca=" + certs->ca, "--leader-lease-seconds=2",
       // A prefix of its own: were the certificate not required, it would
       // lead there at once, not wait behind the cluster's leader.
       "--etcd-prefix=/refused/"},
      log);
  ASSERT_TRUE(refused.ok()) << refused.status();
  const bool said = EtcdWaitFor(
      [&] {
        const std::string text = ReadAll(log);
        return absl::StrContains(text, "cannot get a lease") &&
               absl::StrContains(text, (*etcd)->endpoint()) &&
               absl::StrContains(text, "that etcd trusts the client certificate (--etcd-cert)");
      },
      absl::Seconds(60));
  EXPECT_TRUE(said) << ReadAll(log);
  EXPECT_FALSE(absl::StrContains(ReadAll(log), "became leader")) << ReadAll(log);
  EXPECT_EQ(refused->Poll(), std::nullopt) << "it should campaign on, not exit";
  refused->Terminate(absl::Seconds(10));
}

// etcd's own auth: the coordinator logs in as --etcd-user with the
// password in --etcd-password-file (over TLS) and trains a job.
TEST(EtcdTlsClusterTest, PasswordLogin_LeadsAndTrains) {
  const std::string cert_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/auth-certs");
  mkdir(cert_dir.c_str(), 0700);
  absl::StatusOr<EtcdTestCertificates> certs = MakeEtcdTestCertificates(cert_dir);
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> probe =
      ClientTlsCredentials(certs->ca, "", "");
  ASSERT_TRUE(probe.ok()) << probe.status();
  EtcdServerTls tls;
  tls.cert_file = certs->server_cert;
  tls.key_file = certs->server_key;
  tls.probe_credentials = *probe;
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("auth-cluster", tls);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ASSERT_EQ(EnableEtcdAuth((*etcd)->endpoint(), tls.probe_credentials, "/pipetrain/", "coord",
                           "etcd-password-1"),
            absl::OkStatus());
  const std::string password_file = cert_dir + "/etcd.password";
  {
    std::ofstream out(password_file);
    out << "etcd-password-1\n";
  }
  chmod(password_file.c_str(), 0600);
  std::unique_ptr<LocalCluster> cluster = testing::StartTestCluster(
      "etcd-auth", /*workers=*/1,
      {"--etcd-endpoints=https://" + (*etcd)->endpoint(), "--etcd-ca=" + certs->ca,
       "--etcd-user=coord", "--etcd-password-file=" + password_file, "--leader-lease-seconds=2"});
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  ASSERT_TRUE(AwaitOneReadyWorker(*stub))
      << "no READY worker behind a leading coordinator within 60 s";
  const std::string id = testing::SubmitJob(*stub, testing::TinyJobSpec(/*steps=*/3));
  const v1::Job job = testing::AwaitJob(*stub, id, kJobTimeout, testing::Ended);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
}

}  // namespace
}  // namespace pipetrain
