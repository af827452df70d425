// FindCoordinator: finding the leader among highly available coordinators,
// against canned gRPC servers on loopback.
#include "cli/coordinator_client.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/coordinator_endpoints.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Finishes at once; deletes itself when gRPC is done with it.
class Answer final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Answer(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// Answers every call of any method with `status`, naming `leader` in the
// trailing metadata when given (as a follower does); counts the calls.
class Canned final : public grpc::CallbackGenericService {
 public:
  Canned(grpc::Status status, std::string leader)
      : status_(std::move(status)), leader_(std::move(leader)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    calls_.fetch_add(1);
    if (!leader_.empty()) context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
    return new Answer(status_);
  }
  int calls() const { return calls_.load(); }

 private:
  const grpc::Status status_;
  const std::string leader_;
  std::atomic<int> calls_{0};
};

// A Canned service on a loopback port of its own.
class Server {
 public:
  Server(grpc::Status status, std::string leader) : service_(std::move(status), std::move(leader)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Server() { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int calls() const { return service_.calls(); }

 private:
  Canned service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

const grpc::Status kRefused(grpc::StatusCode::UNAVAILABLE, "a follower");
const grpc::Status kLeaderAnswer(grpc::StatusCode::NOT_FOUND, "no job \"\"");

absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>> Find(const std::string& address,
                                                                   absl::Duration timeout) {
  return FindCoordinator("--coordinator", address, grpc::InsecureChannelCredentials(), "token",
                         timeout);
}

TEST(FindCoordinatorTest, MalformedList_InvalidArgumentNamingTheFlag) {
  for (const std::string list : {"", "a:1,,b:2", ","}) {
    auto found = Find(list, absl::Seconds(1));
    EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_EQ(found.status().message(),
              absl::StrCat("--coordinator: \"", list,
                           "\" has an empty address (a comma-separated list of host:port)"));
  }
}

// The follower names the leader; the leader (any answer but a refusal)
// is the one the stub is for.
TEST(FindCoordinatorTest, FollowerNamesAListedLeader_ItIsFollowed) {
  Server leader(kLeaderAnswer, "");
  Server follower(kRefused, leader.address());
  auto found = Find(absl::StrCat(follower.address(), ",", leader.address()), absl::Seconds(10));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(leader.calls(), 1);
  grpc::ClientContext context;
  v1::Job job;
  (*found)->GetJob(&context, v1::GetJobRequest(), &job);
  EXPECT_EQ(leader.calls(), 2);  // the stub is the leader's
}

// A listed coordinator naming an address outside the list is not followed:
// it could be anyone's, and the calls carry the user token.
TEST(FindCoordinatorTest, FollowerNamesAnUnlistedLeader_NeverContacted) {
  Server stranger(kLeaderAnswer, "");
  Server first(kRefused, stranger.address());
  Server second(kRefused, stranger.address());
  auto found = Find(absl::StrCat(first.address(), ",", second.address()), absl::Seconds(1));
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_EQ(stranger.calls(), 0);
  EXPECT_GE(first.calls(), 1);
  EXPECT_GE(second.calls(), 1);
}

TEST(FindCoordinatorTest, OnlyFollowers_UnavailableNamingTheAddresses) {
  Server first(kRefused, "");
  Server second(kRefused, "");
  const std::string list = absl::StrCat(first.address(), ",", second.address());
  auto found = Find(list, absl::Milliseconds(300));
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_EQ(found.status().message().find(absl::StrCat("no coordinator of ", first.address(), ", ",
                                                       second.address(), " led within 300ms")),
            0u)
      << found.status();
}

}  // namespace
}  // namespace pipetrain
