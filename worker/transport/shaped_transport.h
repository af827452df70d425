// ShapedTransport: a Transport whose sends go out as if over a slower link
// (DESIGN.md §12, link emulation), so that one machine's loopback can stand
// in for a 10 Gbit/s or 1 Gbit/s network in benchmarks.
//
// Each link (this stage to one peer) has a bandwidth and a latency
// (LinkModel). A message of b wire bytes handed over at time t starts
// serialising when the link is free and takes b / bandwidth; it is handed to
// the wrapped transport once that is done plus the latency:
//
//   start_i  = max(t_i, done_{i-1})       done_i = start_i + b_i / bandwidth
//   handoff_i = done_i + latency
//
// so a link carries at most `bandwidth` bytes per second, a lone message
// arrives after b / bandwidth + latency, and back-to-back messages overlap
// their latencies as on a real pipe (LinkShaper computes this; it is a pure
// function of the times given, for tests). What the wrapped transport then
// adds is the real link's own cost, small next to an emulated one.
//
// Sends keep their order per peer and return once queued (the Transport
// contract); one thread per peer sleeps until each message's handoff time.
// At most max_queued_bytes wait per peer; a Send beyond that waits for room.
// When a handoff to a peer fails, the messages queued behind it for that
// peer are dropped, not handed on (the next Send to it returns the error).
// Receives pass straight through (the sender shapes). Thread-safe.
#ifndef PIPETRAIN_WORKER_TRANSPORT_SHAPED_TRANSPORT_H_
#define PIPETRAIN_WORKER_TRANSPORT_SHAPED_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/link_model.h"
#include "worker/transport/transport.h"

namespace pipetrain {

class LinkShaper {
 public:
  explicit LinkShaper(LinkModel model) : model_(model) {}
  // When a message of `bytes` handed over at `now` leaves (see above); call
  // in handover order.
  absl::Time Schedule(absl::Time now, int64_t bytes);

 private:
  const LinkModel model_;
  absl::Time done_ = absl::InfinitePast();
};

class ShapedTransport final : public Transport {
 public:
  // `inner` does the sending and receiving; owned.
  ShapedTransport(std::unique_ptr<Transport> inner, LinkModel model,
                  int64_t max_queued_bytes = int64_t{256} << 20);
  // Delivers what is queued (but what a failed handoff dropped), then stops.
  ~ShapedTransport() override;

  int stage() const override { return inner_->stage(); }
  // Queues `wire` for `peer_stage`, waiting for room if its queue is full.
  // The error of an earlier handoff to that peer, if any (also one that
  // comes while waiting), is returned instead (the tensor is not queued;
  // the error is reported once); ABORTED if the transport is being
  // destroyed.
  absl::Status SendWire(int peer_stage, const TensorAddress& address,
                        const WireTensor& wire) override;
  // SendWire without the copy where `wire` is not shared (an encoded
  // payload, or a raw tensor no other handle holds): the queue keeps it
  // and hands it on as it is, so an emulated link costs the sender no
  // memory traffic of its own (a collective's chunks are fresh copies).
  absl::Status SendWireOwned(int peer_stage, const TensorAddress& address,
                             WireTensor wire) override;
  // The inner transport's; a timeout also says how much of this worker's
  // own sends to that peer still wait on the emulated link.
  absl::StatusOr<WireTensor> RecvWire(int peer_stage, const TensorAddress& address,
                                      absl::Duration timeout) override;

  // Transport::Abort: drops every queued message, ends the Sends waiting
  // for room with ABORTED (and later ones), and aborts the inner transport.
  void Abort() override;

  // Waits up to `timeout` until exactly `count` Sends wait for room in a
  // full queue; returns whether that happened. For tests.
  bool AwaitSendsWaiting(int count, absl::Duration timeout);
  // Waits up to `timeout` until exactly `count` messages, taken off their
  // queues, wait out their emulated link time. For tests.
  bool AwaitHandoffsWaiting(int count, absl::Duration timeout);

 private:
  struct Pending {
    TensorAddress address;
    WireTensor wire;
    absl::Time handoff;
    int64_t bytes = 0;
  };
  struct Link {
    LinkShaper shaper;
    std::deque<Pending> queue;
    int64_t queued_bytes = 0;
    absl::Status error;  // of a handoff; reported by the next Send
    std::thread thread;
    explicit Link(LinkModel model) : shaper(model) {}
  };
  void Run(int peer_stage, Link* link);
  // Queues `wire`, which nothing else holds, for `peer_stage`.
  absl::Status Enqueue(int peer_stage, const TensorAddress& address, WireTensor wire);

  const std::unique_ptr<Transport> inner_;
  const LinkModel model_;
  const int64_t max_queued_bytes_;
  AnnotatedMutex mu_;
  std::map<int, std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;   // Abort()
  int sends_waiting_ ABSL_GUARDED_BY(mu_) = 0;  // for room, in Enqueue
  int handoffs_waiting_ ABSL_GUARDED_BY(mu_) = 0;  // their link time, in Run
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_SHAPED_TRANSPORT_H_
