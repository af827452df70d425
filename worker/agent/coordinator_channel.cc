#include "worker/agent/coordinator_channel.h"

#include <grpc/grpc.h>

#include "common/grpc_server_limits.h"

namespace pipetrain {

// The coordinator's server answers pings faster than this with GOAWAY.
static_assert(kCoordinatorKeepalive >= absl::Milliseconds(kMinClientPingIntervalMs),
              "a worker's keepalive must not ping the coordinator faster than it allows");

grpc::ChannelArguments CoordinatorChannelArguments(absl::Duration keepalive) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(absl::ToInt64Milliseconds(keepalive)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(keepalive / 2)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Pings go on while no call sends anything (gRPC stops after two).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

}  // namespace pipetrain
