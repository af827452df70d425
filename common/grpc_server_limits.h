// Limits every pipetrain gRPC server sets, so that clients without any
// credential cannot exhaust the process before authentication refuses them
// (docs/operations.md, "Bounds").
//
// - Streams per connection: HTTP/2 lets a client open streams on one
//   connection without limit (gRPC's default), each costing memory (about
//   12 KiB) while it waits to be served or refused. At most
//   kMaxStreamsPerConnection are open at once; a client's further streams
//   wait (HTTP/2 flow control). Each open stream may still hold a request
//   left unfinished, up to the server's receive bound (gRPC reads a whole
//   request before any handler checks it): the memory a client without
//   credentials ties up is bounded per connection (streams x that bound),
//   and connections only by the process's file descriptors (no memory
//   quota is set; docs/operations.md, "Bounds"). A worker's connection to
//   the coordinator keeps a few streams (register, heartbeats, assignments,
//   reports); a peer's data-plane connection one per sending stage.
// - Threads: gRPC's synchronous services (server reflection, the only one
//   pipetrain serves) take one thread per open call, and a reflection
//   stream needs no credential: unbounded, a client could open streams
//   until thread creation fails and the process aborts (a pids limit). At
//   most kMaxSyncServerThreads run them; a call past that is answered
//   RESOURCE_EXHAUSTED. Callback services (the coordinator API, the data
//   plane, the worker's WorkerControlService, health) take no threads of
//   their own, so held reflection streams keep none of their calls out:
//   every service a client with credentials needs must be a callback one.
// - Pings: clients may ping every kMinClientPingIntervalMs, with or
//   without a call open (a worker's keepalive to the coordinator); faster
//   ones are answered GOAWAY, as gRPC does.
#ifndef PIPETRAIN_COMMON_GRPC_SERVER_LIMITS_H_
#define PIPETRAIN_COMMON_GRPC_SERVER_LIMITS_H_

#include <grpcpp/server_builder.h>

#include "absl/time/time.h"

namespace pipetrain {

inline constexpr int kMaxStreamsPerConnection = 32;
inline constexpr int kMaxSyncServerThreads = 16;
// The most often a client may ping without data (its keepalive) before
// the server answers GOAWAY: every 10 s.
inline constexpr int kMinClientPingIntervalMs = 10000;

// Applies the limits above to `builder`; `name` names its resource quota
// (gRPC's debug output).
void ApplyGrpcServerLimits(grpc::ServerBuilder& builder, const char* name);

// Has the server ping each connection idle for `every`, and close one
// whose answer takes longer than `timeout`, for as long as it is open (not
// gRPC's two pings without data): a client that vanished without closing
// (a host lost, a partition) would otherwise keep its streams, and what
// they hold, until TCP gave up (hours when nothing is being sent).
void PingIdleClients(grpc::ServerBuilder& builder, absl::Duration every, absl::Duration timeout);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_GRPC_SERVER_LIMITS_H_
