// The arguments of a gRPC channel to the coordinator: a worker's, and the
// CLI's (CoordinatorClientChannelArguments).
//
// Reconnects: a coordinator that comes back (a restart, a new leader) is
// found within 2 s (gRPC's default backoff grows to 2 minutes, and a worker
// that registers after --restart-grace-seconds misses its job's resume).
//
// Keepalive: a coordinator whose host vanished without closing the
// connection (a node lost or partitioned; in Kubernetes the Service's
// connection stays pinned to the dead pod's address) left the channel
// READY, every call timing out on it, until the kernel gave the connection
// up (tcp_retries2: about 15 minutes), so the worker could not register
// with the coordinator that replaced it. HTTP/2 pings every `keepalive`,
// unanswered within half of it, close such a connection, and the next call
// connects afresh (resolving the name again). Pings go whether or not a
// call is open. The coordinator's server accepts them (ApplyGrpcServerLimits
// allows one every 10 s), so `keepalive` must be at least that outside
// tests.
//
// Proxies: these arguments apply to any address. Create the channel with
// CreateCustomChannelSkippingLoopbackProxy (common/loopback_channel.h),
// so that $http_proxy never takes a loopback coordinator's calls.
#ifndef PIPETRAIN_WORKER_AGENT_COORDINATOR_CHANNEL_H_
#define PIPETRAIN_WORKER_AGENT_COORDINATOR_CHANNEL_H_

#include <grpcpp/support/channel_arguments.h>

#include "absl/time/time.h"

namespace pipetrain {

inline constexpr absl::Duration kCoordinatorKeepalive = absl::Seconds(20);

grpc::ChannelArguments CoordinatorChannelArguments(
    absl::Duration keepalive = kCoordinatorKeepalive);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_COORDINATOR_CHANNEL_H_
