#include "common/grpc_server_limits.h"

#include <grpcpp/resource_quota.h>

namespace pipetrain {

void ApplyGrpcServerLimits(grpc::ServerBuilder& builder, const char* name) {
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  // The builder keeps its own reference to the quota.
  grpc::ResourceQuota quota(name);
  quota.SetMaxThreads(kMaxSyncServerThreads);
  builder.SetResourceQuota(quota);
}

}  // namespace pipetrain
