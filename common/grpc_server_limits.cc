#include "common/grpc_server_limits.h"

#include <grpcpp/resource_quota.h>

namespace pipetrain {

void ApplyGrpcServerLimits(grpc::ServerBuilder& builder, const char* name) {
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  // Clients' keepalive pings (a worker's to the coordinator, every 20 s,
  // worker/agent/coordinator_channel.h), with or without a call open:
  // refused at gRPC's default (one per 5 minutes), they would be answered
  // GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinClientPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The builder keeps its own reference to the quota.
  grpc::ResourceQuota quota(name);
  quota.SetMaxThreads(kMaxSyncServerThreads);
  builder.SetResourceQuota(quota);
}

void PingIdleClients(grpc::ServerBuilder& builder, absl::Duration every, absl::Duration timeout) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(every)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // With no call open too (ApplyGrpcServerLimits sets it as well, for
  // clients' pings).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

}  // namespace pipetrain
