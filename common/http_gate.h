// HttpGate: one thread that reads whole HTTP requests from many connections
// at once, so that a slow client costs a buffer, never a thread.
//
// The HTTP server (common/http_server.h) hands it each accepted socket. The
// gate's thread polls every connection (non-blocking sockets), buffers each
// request until it is complete (head and Content-Length body, see
// common/http_framing.h) and only then dispatches it; a handler thread
// answers with Respond, and the gate writes the answer and closes. Handler
// threads never touch a socket, so a client that trickles its request or
// never reads its answer holds no handler.
//
// Per connection:
//
//   Admit ──> kReading ──complete──> kHandling ──Respond──> kWriting
//               │                                             │ all written
//               │ rejected / request_timeout                  v
//               └──────── error response ────────────> kLingering ──> closed
//                                                     (written, then EOF,
//                                                      error or `linger`)
//
// At max_connections open connections (reading, handling or writing), a new
// one takes the place of the oldest one still reading its request (answered
// 503; what it has sent is read first, so a request that has arrived whole
// is handled, not turned away unread), or else of the oldest whose client
// does not read its answer (closed with the answer cut off); with neither,
// the new one is answered 503 at once. So idle, trickling or non-reading
// clients cannot keep every slot, and /healthz answers. Nor can clients
// whose requests all wait for a handler: past max_connections, up to
// probe_connections more are admitted for probes only (Options::is_probe);
// such a connection whose request is no probe is answered 503 once it is
// whole. The two kinds of place are counted apart: a probes-only
// connection never makes room for a regular one (else a silent one and a
// whole request, pair after pair, would queue requests past
// max_connections); when the probe places are full too, the oldest
// probes-only connection still reading its request makes room (as above)
// for the new one, which is then probes-only as well. The server runs
// probes on a thread of their own (http_server.h), so they are answered at
// once. Answers not yet written are bounded in
// bytes too (max_unsent_response_bytes): past it, the oldest unread one is
// cut off.
// Answers go out with "Connection: close";
// after the last byte the gate shuts its side down and reads until the
// client closes (at most `linger`), so a client still sending a rejected body
// reads the answer instead of a connection reset. At most max_connections
// connections linger; beyond, a connection is closed once answered.
//
// Error answers are google.rpc.Status JSON (common/http_response.h):
// the framing rejections (400, 411, 413, 415, 431), 408 DEADLINE_EXCEEDED when
// a request is not complete within request_timeout of its accept, and 503
// UNAVAILABLE over max_connections. A response that has not moved
// kMinResponseProgressBytes (or its end) within response_timeout is
// abandoned (the connection is closed); each time it has, the wait starts
// again, so a large answer read steadily is not cut, nor held for ever by
// a client that takes a few bytes at a time.
//
// Thread-safety: Admit, Respond and Stop may be called from any thread.
#ifndef PIPETRAIN_COMMON_HTTP_GATE_H_
#define PIPETRAIN_COMMON_HTTP_GATE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/http_framing.h"

namespace pipetrain {

// A complete request, as the client sent it, for a handler thread.
struct GatedRequest {
  uint64_t connection = 0;  // pass to HttpGate::Respond
  std::string bytes;        // the head and body, exactly (nothing after them)
  std::string remote_ip, local_ip;
  int remote_port = 0, local_port = 0;
  // When the request was complete, a MonotonicClock() reading (common/
  // clock.h): its handling is timed from here, its wait for a handler
  // thread included.
  absl::Time complete;
};

// The bytes an answer must move within each response_timeout to keep its
// connection (HttpGate::Options::response_timeout).
inline constexpr size_t kMinResponseProgressBytes = size_t{64} << 10;

class HttpGate {
 public:
  struct Options {
    HttpRequestLimits limits;
    size_t max_connections = 256;
    absl::Duration request_timeout = absl::Seconds(10);   // accept to last body byte
    absl::Duration response_timeout = absl::Seconds(10);  // longest write stall
    absl::Duration linger = absl::Seconds(2);
    // Answer bytes not yet written, over all connections; past it, the
    // oldest connection with part of an answer unwritten (other
    // than the one just answered) is cut off, until under it or none is
    // left. HttpServer::Options::max_unsent_response_bytes.
    size_t max_unsent_response_bytes = 256 << 20;
    // Whether a complete request (its bytes) is a health probe; unset:
    // none is, and no connection is admitted past max_connections.
    std::function<bool(absl::string_view request)> is_probe;
    size_t probe_connections = 8;
    // Called on the gate's thread for each error answer the gate gives
    // itself (the rejections above), with the bytes received so far (the
    // request line, when it arrived), the status, and the time since the
    // connection was accepted. Must be quick and must not block; unset: none.
    std::function<void(absl::string_view received, int status, absl::Duration elapsed)> on_reject;
  };
  // Called on the gate's thread with each complete request. Must not block
  // (queue the request for another thread) and must not call Stop.
  using Dispatch = std::function<void(GatedRequest)>;

  // Starts the gate's thread. Errors: UNAVAILABLE when its wake-up eventfd
  // cannot be created (out of file descriptors).
  static absl::StatusOr<std::unique_ptr<HttpGate>> Start(Options options, Dispatch dispatch);
  ~HttpGate();  // Stop()
  HttpGate(const HttpGate&) = delete;
  HttpGate& operator=(const HttpGate&) = delete;

  // Takes ownership of the connected socket `fd`. Never blocks on the
  // client. After Stop: closes `fd`.
  void Admit(int fd);

  // The answer to request `connection`, as bytes on the wire (it should say
  // "Connection: close"); empty closes the connection without one. Ignored
  // when the connection is gone (Stop, or a second Respond).
  void Respond(uint64_t connection, std::string response);

  // The first step of a graceful stop (HttpServer::Stop with a grace):
  // from now on a request that arrives whole is answered 503 UNAVAILABLE
  // ("shutting down") instead of dispatched; requests already dispatched
  // are still answered, and their answers written, until Stop, which waits
  // for them until `deadline` (a MonotonicClock() reading). Returns once
  // the gate's thread has seen it (no request is dispatched after), or at
  // the deadline. Any thread; idempotent (the first deadline holds).
  void Finish(absl::Time deadline);

  // Closes every connection (slow clients included), then joins the thread.
  // After Finish, first waits until `deadline` for the answers handed over
  // and being written (and their clients' reading them: lingering) to go out;
  // requests dispatched and never answered are not waited for (their
  // handlers are gone). Requests that Respond after Stop began are ignored.
  // Idempotent, but not concurrently with itself or the destructor.
  void Stop();

 private:
  enum class State { kReading, kHandling, kWriting, kLingering };
  struct Connection;

  HttpGate(Options options, Dispatch dispatch, int wake_fd);

  void Wake();  // any thread

  // The loop and its steps. They run on the gate's thread only and own
  // `connections_` (no lock: no other thread touches it). A connection
  // marked done is closed by the next Sweep, so no step frees a connection
  // another step still holds.
  void Loop();
  // Takes what other threads handed over. False once the loop should end:
  // Stop was called and, after Finish, nothing is left to write or the
  // deadline has passed.
  bool TakeMail(std::vector<int>& admitted, std::vector<std::pair<uint64_t, std::string>>& answers);
  // After Finish and Stop: whether some connection still has an answer
  // going out (written or lingering for its client to read it).
  bool Writing() const;
  void Adopt(int fd);
  void Answer(uint64_t id, std::string response);
  void PollOnce();
  void OnEvents(Connection& connection, short revents);
  // Reads once: whether bytes came (the request may now be handed off or
  // rejected, or the connection done).
  bool OnReadable(Connection& connection);
  // Reads until the socket has nothing more or the connection leaves
  // kReading.
  void ReadAvailable(Connection& connection);
  // Whether a new connection fits among the open ones admitted as it would
  // be (`probes_only`, or regular): fewer than their places
  // (probe_connections, or max_connections) are open, or one is freed by
  // turning away the oldest of them still reading its request (503; it is
  // read first, and handed off if whole) or, for a regular place, by
  // cutting off the oldest whose client does not read its answer.
  bool MakeRoom(bool probes_only);
  // The connection accepted longest ago of those still reading their
  // request and admitted as `probes_only` (or regular); nullptr when none is.
  Connection* OldestReading(bool probes_only);
  // Cuts off stalled answers (oldest first, never `answered`) while the
  // unsent bytes exceed max_unsent_response_bytes.
  void LimitUnsentBytes(const Connection& answered);
  void Frame(Connection& connection);
  void HandOff(Connection& connection);
  void Drain(Connection& connection);
  void Send(Connection& connection, absl::string_view bytes);
  void Flush(Connection& connection);
  void Reject(Connection& connection, int status, const std::string& code,
              const std::string& message);
  void StartLingering(Connection& connection);
  void Expire(absl::Time now);
  void Sweep();
  size_t CountIn(State state) const;
  // Reading, handling or writing, not done, and admitted as `probes_only`
  // (or regular): the two kinds of place are counted apart.
  size_t CountOpen(bool probes_only) const;

  const Options options_;
  const Dispatch dispatch_;
  const int wake_fd_;  // eventfd: Admit, Respond and Stop wake the poll with it

  AnnotatedMutex mu_;
  std::vector<int> admitted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, std::string>> answers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_acked_ ABSL_GUARDED_BY(mu_) = false;  // the loop has seen finishing_
  bool ended_ ABSL_GUARDED_BY(mu_) = false;            // the loop is over
  absl::Time finish_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::map<uint64_t, std::unique_ptr<Connection>> connections_;  // the loop's own
  bool finishing_seen_ = false;  // the loop's own copy of finishing_, for HandOff
  bool stopping_seen_ = false;   // and of stopping_, for Loop
  // The loop's own: once stopping, its poll wakes by the finish deadline.
  absl::Time poll_until_ = absl::InfiniteFuture();
  uint64_t next_id_ = 1;                                          // the loop's own
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_HTTP_GATE_H_
