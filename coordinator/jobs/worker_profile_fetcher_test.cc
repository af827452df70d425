#include "coordinator/jobs/worker_profile_fetcher.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>

#include "gtest/gtest.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"

namespace pipetrain {
namespace {

// Refuses the first `refusals` calls as a worker that has not read its
// session yet does, then answers with a profile of one unit.
class RefusingWorkerControl final : public v1::WorkerControlService::Service {
 public:
  explicit RefusingWorkerControl(int refusals) : refusals_(refusals) {}
  grpc::Status Profile(grpc::ServerContext*, const v1::ProfileRequest*,
                       v1::ModelProfile* profile) override {
    if (calls_.fetch_add(1) < refusals_) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no session yet");
    }
    profile->add_units();
    return grpc::Status::OK;
  }
  int calls() const { return calls_.load(); }

 private:
  const int refusals_;
  std::atomic<int> calls_{0};
};

struct Served {
  explicit Served(int refusals) : service(refusals) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Served() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  RefusingWorkerControl service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(WorkerProfileFetcherTest, AsksAgainWhileTheWorkerHasNoSession) {
  Served worker(/*refusals=*/2);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->units_size(), 1);
  EXPECT_EQ(worker.service.calls(), 3);
}

TEST(WorkerProfileFetcherTest, GivesUpAfterTheRetries) {
  Served worker(/*refusals=*/1000);
  absl::StatusOr<v1::ModelProfile> profile =
      MakeWorkerProfileFetcher(absl::Seconds(30))(worker.address(), "token", {});
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(profile.status().message().find("no session yet"), std::string::npos);
  EXPECT_EQ(worker.service.calls(), kProfileSessionRetries + 1);
}

}  // namespace
}  // namespace pipetrain
