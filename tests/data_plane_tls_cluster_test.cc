// The data plane's mutual TLS end to end, on real processes: a coordinator
// with --worker-tls-* and workers with --data-tls-* (certificates of one
// CA, made with openssl). A job of 2 replicas x 2 stages (activations,
// gradients and the data-parallel all-reduce all cross TLS) is profiled on
// a worker over TLS (WorkerControl shares the port) and equals train-local;
// a worker registering without TLS is refused, naming the flags.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "common/build_identity.h"
#include "common/testing/test_certificates.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/parallel_cluster_testing.h"

namespace pipetrain {
namespace {

using testing::Reference;

class DataPlaneTlsClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/certs");
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0) << dir;
    absl::StatusOr<testing::TestCertificates> made = testing::MakeTestCertificates(dir);
    ASSERT_TRUE(made.ok()) << made.status();
    const testing::TestCertificates& c = *made;
    // Every worker serves, and presents to its peers, the certificate for
    // 127.0.0.1; the coordinator presents its client certificate.
    cluster_ =
        testing::StartTestCluster("dptls", 4,
                                  {"--worker-tls-ca=" + c.ca, "--worker-tls-cert=" + c.client_cert,
                                   "--worker-tls-key=" + c.client_key},
                                  {"--data-tls-cert=" + c.server_cert,
                                   "--data-tls-key=" + c.server_key, "--data-tls-ca=" + c.ca})
            .release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static LocalCluster* cluster_;
};

LocalCluster* DataPlaneTlsClusterTest::cluster_ = nullptr;

TEST_F(DataPlaneTlsClusterTest, ReplicatedPipelineOverTls_ProfiledAndMatchesTrainLocal) {
  ASSERT_NE(cluster_, nullptr);
  v1::JobSpec spec =
      testing::ParallelTestSpec({"tls", 2, 8, 4, 5, /*stages=*/2, "1f1b", "tls.safetensors"});
  spec.mutable_parallelism()->set_data(2);
  const Reference ref = testing::TrainLocally(spec);
  v1::Job ended;
  testing::ExpectMatchesTrainLocal(cluster_, spec, ref, &ended);
  auto stub = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  v1::GetPlanRequest request;
  request.set_job_id(ended.id());
  v1::Plan plan;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(stub->GetPlan(&context, request, &plan).ok());
  // The coordinator's WorkerControl call crossed the worker's TLS port.
  EXPECT_TRUE(absl::StartsWith(plan.profile_source(), "measured on cpu:")) << plan.profile_source();
}

TEST_F(DataPlaneTlsClusterTest, WorkerWithoutTls_RefusedNamingTheFlags) {
  ASSERT_NE(cluster_, nullptr);
  auto raw = v1::CoordinatorService::NewStub(
      grpc::CreateChannel(cluster_->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::RegisterWorkerRequest request;
  request.set_join_token("test-join-token");
  request.set_data_address("127.0.0.1:9");
  *request.mutable_build() = ThisBuild();
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::Status refused = raw->RegisterWorker(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(refused.error_message(),
                                "serves its data plane in plaintext, but the coordinator's "
                                "workers use TLS (--worker-tls-ca)"))
      << refused.error_message();
}

}  // namespace
}  // namespace pipetrain
