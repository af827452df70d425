// FollowerService: what a coordinator that is not serving the API serves on
// its gRPC port (highly available coordinators, DESIGN.md §11): a follower,
// and a new leader until it has loaded its state. Every call, of any
// method, is refused with UNAVAILABLE, a message naming the leader, and
// the leader's address in the trailing metadata kLeaderMetadataKey
// (common/coordinator_endpoints.h), which workers and the CLI follow. A
// leader still loading names itself there, and says so ("leads; loading
// its state; retry"): clients ask it again rather than moving on to the
// followers, which would only send them back. No request is read and
// nothing is authenticated: the answer is the same for everyone, and says
// only where the leader is (which clients are told anyway). Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_API_FOLLOWER_SERVICE_H_
#define PIPETRAIN_COORDINATOR_API_FOLLOWER_SERVICE_H_

#include <grpcpp/generic/async_generic_service.h>

#include <functional>
#include <string>

namespace pipetrain {

class FollowerService final : public grpc::CallbackGenericService {
 public:
  // `leader` returns the current leader's address ("" when none is known);
  // `leading` whether this coordinator is that leader (still loading its
  // state, as it serves this). Both thread-safe.
  FollowerService(std::function<std::string()> leader, std::function<bool()> leading)
      : leader_(std::move(leader)), leading_(std::move(leading)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  const std::function<std::string()> leader_;
  const std::function<bool()> leading_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_FOLLOWER_SERVICE_H_
