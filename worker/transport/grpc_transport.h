// GrpcTransport: the Transport of one stage over the gRPC data plane
// (DESIGN.md §6). SendWire splits a WireTensor (raw, or a compression
// codec's payload, carried as opaque bytes) into frames (frame_codec.h) and
// queues them on the one long-lived DataPlane/Stream to the destination
// peer; RecvWire takes from the worker's Mailbox, which the worker's
// DataPlaneServer fills with what peers send here, exactly as it was sent.
//
// Per peer, a stream goes through:
//
//   none --Send: connect (<= connect_timeout)--> open --Shutdown--> closed
//     ^                                           |
//     |                    peer gone / write failed
//     |                                           v
//     +------- Send reports UNAVAILABLE ------ broken
//
// so after a break exactly one SendWire fails with UNAVAILABLE (naming the peer)
// and the SendWire after it makes one new connection attempt.
//
// Writes: one frame in flight per stream; the frames of one tensor are
// queued together, so they never interleave with another tensor's frames.
// Send returns once its frames are queued (it does not wait for the
// network), except that:
//   - the first Send to a peer (and the first after a break) connects, which
//     waits up to connect_timeout;
//   - memory bound: while earlier frames to the peer hold more than
//     max_queued_bytes_per_peer of payload, Send waits for room (up to
//     queue_wait_timeout). A queue holds at most
//     max(max_queued_bytes_per_peer, largest tensor) of payload, and each
//     Send briefly holds one encoded copy of its tensor besides.
//
// Rejections: a FrameError from the peer is logged and returned, with the
// peer's code (its Status's: ABORTED for a job stopped there, which the
// stage takes for a lost peer; INTERNAL where the peer gives none) and
// error text, by the next Send to that peer (that Send's tensor is not
// sent); if the stream broke since, that Send is the break's UNAVAILABLE
// instead, unless the refusal names a fault of the job's own (a code other
// than ABORTED, UNAVAILABLE or DEADLINE_EXCEEDED): then the refusal, and
// the Send after it the break. The stream stays open.
//
// No threads of its own: completions run on gRPC's callback threads, which
// never wait for anything but short mutexes.
#ifndef PIPETRAIN_WORKER_TRANSPORT_GRPC_TRANSPORT_H_
#define PIPETRAIN_WORKER_TRANSPORT_GRPC_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "worker/transport/data_plane_auth.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/mailbox.h"
#include "worker/transport/transport.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace pipetrain {

// How often a connection attempt checks for GrpcTransport::Abort.
inline constexpr absl::Duration kConnectAbortSlice = absl::Milliseconds(50);

struct GrpcTransportOptions {
  // Proves each stream to its receiver (data_plane_auth.h): the job and this
  // worker's link keys. An empty job_id or send_keys sends no proof (only a
  // receiver without a receive key, in tests, accepts that).
  JobCredential credential;
  // Payload per frame; 1 <= max_frame_bytes <= kMaxFramePayloadBytes.
  int64_t max_frame_bytes = kMaxFramePayloadBytes;
  // How long a Send waits for a (re)connection before UNAVAILABLE.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Memory bound per peer (see above) and how long Send waits for room,
  // in its queue while the peer holds its stream (beyond the peer's
  // run-ahead window, or for room in the peer's full mailbox). A worker
  // raises both waits to its receive timeout
  // (WaitForHeldStreamsAsLongAsReceivers).
  int64_t max_queued_bytes_per_peer = int64_t{256} << 20;
  absl::Duration queue_wait_timeout = absl::Seconds(60);
  // How long Shutdown lets the streams deliver their queued frames (and
  // their peers finish the calls, which says the frames were read) before
  // cancelling them: one deadline for all peers at once, not one each;
  // an Abort before cuts it to nothing.
  absl::Duration shutdown_drain_timeout = absl::Seconds(10);
  // Called when `peer_stage` rejects a frame (the peer's code and text) or
  // its stream breaks (UNAVAILABLE; not after Shutdown; also the normal end
  // of a job's stream). Runs on a gRPC thread: must return quickly and must
  // not call into this transport. The worker sets none (tests do): a break
  // is noted for the link's later timeouts either way.
  std::function<void(int peer_stage, const absl::Status& error)> on_peer_error;
  // TLS to the peers' data planes (the worker's --data-tls-*: its own
  // certificate, and the CA their servers' must chain to); null:
  // plaintext. `tls_server_name`: the name each peer's certificate is
  // checked for instead of its address's host ("": that host), so workers
  // whose addresses change may share one certificate of a fixed name.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  std::string tls_server_name;
};

// Raises `options`' waits for a peer that does not read its stream (a
// Send waiting for room, Shutdown's drain) to at least `recv_timeout`, the
// receiving workers' own wait for a tensor (--recv-timeout-seconds). Why:
// a receiver holds a stream whose next tensor is beyond its run-ahead
// window (mailbox.h) until it gets there, which legal programs need (a
// Bi-Partition plan whose last stage only runs the head's forward pass:
// its sender runs ahead), and one whose next tensor lacks room in its full
// mailbox until a Take makes room, which a GPipe stage slower than the one
// before it causes routinely (a tensor its stage is blocked on is never
// held so: Mailbox::ReserveOrHold). A Send that gave up first failed the
// job, and a stage that ran every step and shut down first cancelled its
// last tensors, which the receiver then waited for in vain: both at a
// fixed 60 s and 10 s, whatever the operator had allowed a slow stage.
void WaitForHeldStreamsAsLongAsReceivers(absl::Duration recv_timeout,
                                         GrpcTransportOptions* options);

class GrpcTransport final : public Transport {
 public:
  // `peer_addresses[s]` is the data-plane address ("host:port") of stage s
  // (this stage's own entry is used only if it sends to itself). `mailbox`
  // is the one the local DataPlaneServer fills; it must outlive this.
  // Requires 0 <= stage < peer_addresses.size() and valid options (checked).
  // Connects nothing yet.
  GrpcTransport(int stage, std::vector<std::string> peer_addresses, Mailbox* mailbox,
                GrpcTransportOptions options = {});
  ~GrpcTransport() override;  // Shutdown().

  GrpcTransport(const GrpcTransport&) = delete;
  GrpcTransport& operator=(const GrpcTransport&) = delete;

  int stage() const override { return stage_; }

  // Queues `wire`'s frames for `peer_stage` (see the file comment).
  // Thread-safe. Errors: INVALID_ARGUMENT for a peer outside the plan, a
  // null raw tensor, or an encoded tensor that CheckSendable rejects
  // (unknown codec spec, empty payload); UNAVAILABLE naming the peer if it
  // cannot be reached or its stream broke (the tensor and anything queued
  // before it are lost); the peer's code (INTERNAL if none) and text if
  // it rejected an earlier frame; DEADLINE_EXCEEDED if the queue stayed full for
  // queue_wait_timeout; ABORTED after Shutdown.
  absl::Status SendWire(int peer_stage, const TensorAddress& address,
                        const WireTensor& wire) override;
  // The same, but frames reference `wire`'s memory instead of a copy when
  // it is not shared (Transport::SendWireOwned): the queue then holds the
  // tensor itself until its frames are written.
  absl::Status SendWireOwned(int peer_stage, const TensorAddress& address,
                             WireTensor wire) override;

  // Mailbox::Take of `address` from `peer_stage`: the WireTensor as sent.
  // Errors: DEADLINE_EXCEEDED naming the peer (stage and address) and the
  // tensor; INVALID_ARGUMENT for a peer outside the plan; ABORTED after
  // Shutdown (a RecvWire already waiting ends when the mailbox's owner shuts
  // the mailbox down, or at its timeout). Thread-safe.
  absl::StatusOr<WireTensor> RecvWire(int peer_stage, const TensorAddress& address,
                                      absl::Duration timeout) override;

  // Transport::Abort: every stream is cancelled, its queued frames
  // dropped; a Send waiting for room or for a connection returns ABORTED
  // (a connection attempt notices within kConnectAbortSlice); later sends
  // and receives are ABORTED, and Shutdown then drains nothing.
  void Abort() override;

  // Waits up to `timeout` until exactly `count` Sends wait for room in a
  // full queue; returns whether that happened. For tests.
  bool AwaitSendsWaitingForRoom(int count, absl::Duration timeout);

  // Closes every stream at once: each half-closes as soon as its queued
  // frames are written, and is cancelled if its peer has not finished the
  // call within shutdown_drain_timeout (one deadline for all: peers that
  // vanished cost one drain, not one each); then waits for gRPC to finish
  // with them. An in-progress connection attempt is waited for. Later
  // sends and receives return ABORTED. Does not shut the mailbox down (the
  // worker owns it). Idempotent; thread-safe.
  void Shutdown();

 private:
  class PeerLink;
  struct SendWaits;

  absl::Status CheckPeer(int peer_stage) const;
  // `owner`, when given, is `wire` taken over: frames reference its bytes.
  absl::Status SendFrames(int peer_stage, const TensorAddress& address, const WireTensor& wire,
                          const std::shared_ptr<const WireTensor>& owner);

  const int stage_;
  const std::vector<std::string> peer_addresses_;
  Mailbox* const mailbox_;
  const GrpcTransportOptions options_;
  std::unique_ptr<SendWaits> send_waits_;         // before links_, which use it
  std::vector<std::unique_ptr<PeerLink>> links_;  // Indexed by peer stage.
  std::atomic<bool> shut_down_{false};
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_GRPC_TRANSPORT_H_
