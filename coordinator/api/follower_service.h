// FollowerService: what a coordinator that is not the leader serves on its
// gRPC port (highly available coordinators, DESIGN.md §11). Every call, of
// any method, is refused with UNAVAILABLE, a message naming the leader, and
// the leader's address in the trailing metadata kLeaderMetadataKey
// (common/coordinator_endpoints.h), which workers and the CLI follow. No
// request is read and nothing is authenticated: the answer is the same for
// everyone, and says only where the leader is (which clients are told
// anyway). Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_API_FOLLOWER_SERVICE_H_
#define PIPETRAIN_COORDINATOR_API_FOLLOWER_SERVICE_H_

#include <grpcpp/generic/async_generic_service.h>

#include <functional>
#include <string>

namespace pipetrain {

class FollowerService final : public grpc::CallbackGenericService {
 public:
  // `leader` returns the current leader's address ("" when none is known).
  explicit FollowerService(std::function<std::string()> leader) : leader_(std::move(leader)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  const std::function<std::string()> leader_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_FOLLOWER_SERVICE_H_
