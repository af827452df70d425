#include "coordinator/api/follower_service.h"

#include "absl/strings/str_cat.h"
#include "common/coordinator_endpoints.h"

namespace pipetrain {
namespace {

// Finishes at once; deletes itself when gRPC is done with it.
class Refusal final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerGenericBidiReactor* FollowerService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  // Leading asked first: an election won between the two reads then names
  // this coordinator in the trailer of a follower's refusal (clients stay),
  // never the previous leader in a loading leader's (clients leave for a
  // follower that sends them back).
  const bool leading = leading_();
  const std::string leader = leader_();
  if (!leader.empty()) context->AddTrailingMetadata(kLeaderMetadataKey, leader);
  // Naming itself, a leader still loading keeps its clients: the followers
  // would only send them back here.
  if (leading) {
    return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "this coordinator leads and is still loading its state; retry "
                                    "shortly"));
  }
  return new Refusal(grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      leader.empty() ? std::string("this coordinator is a follower and no leader is elected yet; "
                                   "retry shortly")
                     : absl::StrCat("this coordinator is a follower; the leader is ", leader)));
}

}  // namespace pipetrain
