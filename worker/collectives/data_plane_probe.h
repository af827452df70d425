// The data plane's own cost per ring step on this host, measured once at
// start-up so that the planner can add it to the links it models
// (coordinator/planner/data_plane_cost.h).
//
// A step of a collective costs more than its link's latency and bytes /
// bandwidth: the sender frames the chunk, gRPC copies it through the
// kernel, the receiving server parses it into a tensor, the mailbox wakes
// the member, which adds it and sends on. With link emulation
// (shaped_transport.h) that work comes after the emulated link's time, in
// series; on a real network it overlaps the wire in part. Modelled per
// step that moves b bytes each way as
//
//   t(b) = overhead_seconds + b / bytes_per_second
//
// and measured as a collective runs it: two members in this process, each
// its own GrpcTransport to this worker's data plane over loopback,
// all-reduce a tensor of b bytes, which two members do in one exchange of
// b each way (one step), for two sizes (b = kDataPlaneProbeSmallBytes,
// kDataPlaneProbeLargeBytes). The fastest of a dozen all-reduces of each
// size gives the cost with the host's cores free (contention only ever
// adds time; the planner stretches the cost where cores are shared). The
// probe runs under a job of its own, with a fresh random secret, before the
// worker registers; the server refuses other jobs meanwhile, as always.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_DATA_PLANE_PROBE_H_
#define PIPETRAIN_WORKER_COLLECTIVES_DATA_PLANE_PROBE_H_

#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/mailbox.h"

namespace pipetrain {

struct DataPlaneCost {
  double overhead_seconds = 0;  // per step, > 0
  double bytes_per_second = 0;  // > 0
};

// Bytes one step moves each way (the size of the all-reduced tensors).
inline constexpr int64_t kDataPlaneProbeSmallBytes = int64_t{4} << 10;
inline constexpr int64_t kDataPlaneProbeLargeBytes = int64_t{1} << 20;

// The line through (small_bytes, small_seconds) and (large_bytes,
// large_seconds): the rate is the slope's inverse and the overhead the
// small step's time less its bytes at that rate, at least 1 us so that it
// stays positive. INVALID_ARGUMENT unless 0 < small_bytes < large_bytes and
// both times are positive and finite; a large time not above the small one
// (noise) gives the large step's bytes over its time as the rate.
absl::StatusOr<DataPlaneCost> FitDataPlaneCost(int64_t small_bytes, double small_seconds,
                                               int64_t large_bytes, double large_seconds);

// Times the two-member all-reduces above through `server`'s data plane,
// dialling `self_address` (e.g. "127.0.0.1:PORT"); about 20 ms. Requires no
// job set on `server` yet (the probe sets its own and clears it after) and
// nothing else taking from `mailbox`. `credentials` and `tls_server_name`:
// the worker's data-plane TLS (GrpcTransportOptions's; null: plaintext), so
// that a server requiring it is reached and its cost is in the figure.
// The transports' errors (UNAVAILABLE when the data plane cannot reach
// itself, e.g. a certificate that does not name `self_address`'s host) or
// DEADLINE_EXCEEDED.
absl::StatusOr<DataPlaneCost> ProbeDataPlane(
    DataPlaneServer* server, Mailbox* mailbox, const std::string& self_address,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    const std::string& tls_server_name = "");

// "0.11 ms + 1.5 GB/s per message (timed as collective steps)".
std::string DescribeDataPlaneCost(const DataPlaneCost& cost);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_DATA_PLANE_PROBE_H_
