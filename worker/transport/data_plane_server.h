// DataPlaneServer: the receiving end of the gRPC data plane (DESIGN.md §6).
//
// Serves pipetrain.v1.DataPlaneService/Stream with the callback API. Each incoming
// stream (one per sending worker) gets its own FrameAssembler; complete
// WireTensors (raw or encoded, as sent; never decoded here) go into the
// worker's Mailbox, where Transport::RecvWire finds them.
// A rejected frame (see FrameAssembler for the checks, plus a duplicate Put)
// is answered with a FrameError on the same stream, which stays open; the
// incomplete tensor is dropped. Nothing a peer sends can crash the server.
//
// The server accepts frames of one job at a time, set by the worker as its
// assignment changes; until SetJob every stream is refused, and a job
// change ends the streams of the job before (SetJob). A stream must
// prove when it opens that it comes from a stage of that job
// (data_plane_auth.h): otherwise it ends at once, UNAUTHENTICATED (or
// FAILED_PRECONDITION for another job), before any frame is read. A proven
// stream is bound to its job and stage; a frame that names another is
// rejected. Before the first frame of a tensor is buffered, the mailbox is
// asked whether it would take it (Mailbox::Reserve: bytes and run-ahead), so
// an oversized tensor is refused, not assembled; its bytes stay reserved
// while it is assembled (until it is Put, rejected or its stream ends), so
// the tensors of all streams together stay within the mailbox's limit.
//
// Backpressure: a tensor beyond the mailbox's run-ahead window (its sender
// runs more than MailboxLimits::run_ahead_iterations ahead of this stage,
// which legal programs do) is not refused. Its first frame is held
// (Mailbox::HoldBeyondWindow) and the stream is not read further until the
// window reaches it; gRPC flow control then stalls the sender's stream and
// its bounded send queue (GrpcTransportOptions::max_queued_bytes_per_peer)
// makes the sending stage wait. The held frame is then handled, on the
// thread whose Mailbox::Take moved the window, and reading resumes. A hold
// also ends when the mailbox opens a job, drops or aborts the frame's job,
// or shuts down (the frame is then handled, so refused if it must be), or
// when the stream is cancelled or the server moves to another job (SetJob,
// ClearJob: the frame is dropped and the stream ends).
// A tensor that only lacks room in the mailbox (its bytes or count limit
// is full now, but the tensor alone fits the byte limit) is held the same
// way (Mailbox::ReserveOrHold) until a Take, a reservation given back or a
// job's end makes room, so a stage that takes slower than its peer sends
// slows the peer instead of failing the job with RESOURCE_EXHAUSTED. A
// tensor larger than the whole limit is still refused at once. A tensor
// that a Mailbox::Take waits for is not held for room: it is admitted past
// the limit, and a Take that starts waiting for a held one wakes it (on
// the Take's thread), so a stage blocked on it while the mailbox is full of
// tensors it takes only later (e.g. the next iteration's activations
// during an all-reduce) gets it. A held stream still delays the tensors
// behind it: a stage that waits for one of them gets DEADLINE_EXCEEDED at
// its receive timeout (Mailbox::Take), which the job recovers from.
//
// Per stream: frames are processed in the read reaction that delivered them
// (a bounded copy into the tensor plus a Mailbox::Put, neither of which waits
// on anything but a short mutex), and the next read starts after that, so a
// stream holds at most one frame (<= 8 MiB) beyond the tensor being
// assembled, held or not; gRPC flow control pushes back on the sender
// meanwhile. Error replies are written one at a time; at most
// kMaxQueuedFrameErrors wait per stream, more are logged and dropped (a peer
// that never reads them cannot make the server grow).
//
// Streams per sender: a sending stage keeps one stream here (two while a
// broken one is replaced); at most kMaxStreamsPerSourceStage proven streams
// of one (job, stage) are open at once, a further one ends at once with
// RESOURCE_EXHAUSTED, so a peer holding a stage's keys cannot make the
// server hold more than that many frames (8 MiB each) for it. A slot is
// given back as its stream finishes. The server pings idle connections
// (kDataPlaneKeepalive), so one to a peer that vanished without closing
// ends, and gives its slots back, within about 40 s.
#ifndef PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_SERVER_H_
#define PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/server_interceptor.h"
#include "worker/transport/mailbox.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace pipetrain {

inline constexpr int kMaxQueuedFrameErrors = 64;
inline constexpr int kMaxStreamsPerSourceStage = 8;
inline constexpr absl::Duration kDataPlaneKeepalive = absl::Seconds(30);
inline constexpr absl::Duration kDataPlaneKeepaliveTimeout = absl::Seconds(10);

class DataPlaneServer {
 public:
  // Binds `listen_address` ("host:port"; port 0 picks a free port) and starts
  // serving into `mailbox`, which must outlive the server. The port is
  // bound exclusively (no SO_REUSEPORT), so a second server cannot share it.
  // Errors: INVALID_ARGUMENT if the address has no ":port"; UNAVAILABLE if
  // gRPC cannot bind it (in use, or not a local address). `control`, when
  // given, is served on the same port (the worker's WorkerControlService)
  // and must outlive the server. `interceptors` observe every call (the
  // worker's RED metrics, common/metrics/grpc_red_metrics.h).
  // `credentials`: the port's TLS (the worker's --data-tls-*: its
  // certificate, and client certificates required and checked against its
  // CA, so that a process without one signed by it cannot even open a
  // stream or call WorkerControl); null: plaintext.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(
      const std::string& listen_address, Mailbox* mailbox, grpc::Service* control = nullptr,
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
          interceptors = {},
      std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

  ~DataPlaneServer();  // Shutdown().
  DataPlaneServer(const DataPlaneServer&) = delete;
  DataPlaneServer& operator=(const DataPlaneServer&) = delete;

  // From now on accept streams of `job_id` from its workers [0, num_stages)
  // that prove themselves to this worker, whose receive key for the job is
  // `receive_key` (data_plane_auth.h; empty: no proof needed, in-process
  // tests only), and
  // refuse every other job. The open streams of any other job end,
  // FAILED_PRECONDITION ("job ... is over on this worker"), once no frame
  // of theirs is held and no reply is being written, and a tensor they
  // were assembling is freed: without, a peer of an ended job that stops
  // sending mid-tensor would keep up to kMaxStreamsPerSourceStage such
  // buffers per stage, outside the mailbox's limit, for as long as it
  // keeps its connection. Frames already assembled stay in the mailbox
  // (the worker drops them with Mailbox::DropJob). Thread-safe.
  void SetJob(const std::string& job_id, int num_stages, const std::string& receive_key);
  // Reject every frame and end every stream, as SetJob of another job
  // (the worker has no assignment). Thread-safe.
  void ClearJob();

  // The bound port, and "host:port" with the host of the listen address
  // (e.g. "127.0.0.1:40123"); a wildcard host ("0.0.0.0", "[::]") is
  // returned as given, so peers need the machine's address instead.
  int port() const { return port_; }
  std::string address() const;
  // The gRPC server (for its health service, common/serving_health.h).
  grpc::Server* grpc_server() const { return server_.get(); }

  // Cancels every open stream (held ones included), waits until their
  // reactors are gone and stops serving. Idempotent; thread-safe. Tensors
  // already in the mailbox stay there.
  void Shutdown();

 private:
  class Service;

  DataPlaneServer(std::unique_ptr<Service> service, std::unique_ptr<grpc::Server> server,
                  std::string host, int port);

  // Declared before server_: the server must be destroyed first.
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  const std::string host_;
  const int port_;
  AnnotatedMutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_SERVER_H_
