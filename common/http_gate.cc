#include "common/http_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/http_response.h"

namespace pipetrain {
namespace {

// Deadlines and waits are judged on the monotonic clock: a wall clock
// stepped forward would time out every request being read and cut every
// answer being written; stepped back, no timeout would apply meanwhile.
absl::Time GateNow() { return MonotonicClock()->Now(); }

constexpr size_t kReadChunk = 16 * 1024;
constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

bool WouldBlock(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR;
}

// Non-blocking, so no client can stall the gate's thread; close-on-exec, so
// child processes do not inherit client connections.
void MakeNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// The address of one end of `fd` (`peer`: the client's), as httplib reports
// it to handlers. Left empty when the socket has none (already reset).
void Endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  auto* raw = reinterpret_cast<sockaddr*>(&address);
  if ((peer ? getpeername(fd, raw, &length) : getsockname(fd, raw, &length)) != 0) return;
  char text[INET6_ADDRSTRLEN] = "";
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = ntohs(in->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    port = ntohs(in6->sin6_port);
  }
  ip = text;
}

// poll()'s timeout until `deadline`: rounded up, so the loop never wakes
// just before a deadline and spins; -1 (wait for events) when none.
int PollTimeoutMillis(absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return -1;
  if (deadline <= now) return 0;
  const double ms = std::ceil(absl::ToDoubleMilliseconds(deadline - now));
  return static_cast<int>(std::min(ms, static_cast<double>(std::numeric_limits<int>::max())));
}

}  // namespace

struct HttpGate::Connection {
  Connection(uint64_t id, int fd, HttpRequestLimits limits) : id(id), fd(fd), framer(limits) {}

  const uint64_t id;
  const int fd;
  State state = State::kReading;
  absl::Time deadline = absl::InfiniteFuture();  // of the current state
  const absl::Time accepted = GateNow();
  std::string in;  // kReading: every byte received so far
  HttpRequestFramer framer;
  std::string out;     // bytes still to write: "100 Continue", an answer
  size_t written = 0;  // of `out`
  // kWriting: bytes written since the write deadline was last restarted.
  size_t progress = 0;
  bool shut_down = false;  // kLingering: our side sent FIN after the answer
  bool done = false;       // to be closed at the end of this loop turn
  bool probes_only = false;  // admitted past max_connections: probes only
  bool answered = false;     // by a handler (Answer), not rejected by the gate
};

// The 503 answer to a connection turned away at max_connections.
static std::string OverCapMessage(size_t max_connections) {
  return absl::StrCat("the server has the most open connections it accepts (", max_connections,
                      "); retry later");
}

absl::StatusOr<std::unique_ptr<HttpGate>> HttpGate::Start(Options options, Dispatch dispatch) {
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create the HTTP gate's eventfd (errno ", errno, "); out of file descriptors?"));
  }
  return std::unique_ptr<HttpGate>(new HttpGate(std::move(options), std::move(dispatch), wake_fd));
}

HttpGate::HttpGate(Options options, Dispatch dispatch, int wake_fd)
    : options_(std::move(options)),
      dispatch_(std::move(dispatch)),
      wake_fd_(wake_fd),
      thread_([this] { Loop(); }) {}

HttpGate::~HttpGate() {
  Stop();
  close(wake_fd_);
}

void HttpGate::Admit(int fd) {
  {
    AnnotatedMutexLock lock(&mu_);
    if (!stopping_) {
      admitted_.push_back(fd);
      fd = -1;
    }
  }
  if (fd >= 0) {
    close(fd);
    return;
  }
  Wake();
}

void HttpGate::Respond(uint64_t connection, std::string response) {
  {
    AnnotatedMutexLock lock(&mu_);
    if (stopping_) return;
    answers_.emplace_back(connection, std::move(response));
  }
  Wake();
}

void HttpGate::Finish(absl::Time deadline) {
  {
    AnnotatedMutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
    finish_deadline_ = deadline;
  }
  Wake();
  // Until the loop has seen it (its next TakeMail): a request completed in
  // the turn under way is still dispatched, and the caller's wait for the
  // handlers must count it.
  AnnotatedMutexLock lock(&mu_);
  auto seen = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finishing_acked_ || ended_; };
  mu_.AwaitWithTimeout(seen, std::max(absl::ZeroDuration(), deadline - GateNow()));
}

void HttpGate::Stop() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
}

void HttpGate::Wake() {
  const uint64_t one = 1;
  // Fails only if the counter would overflow, and then a wake-up is pending.
  if (write(wake_fd_, &one, sizeof(one)) < 0) return;
}

void HttpGate::Loop() {
  std::vector<int> admitted;
  std::vector<std::pair<uint64_t, std::string>> answers;
  while (TakeMail(admitted, answers)) {
    for (int fd : admitted) Adopt(fd);
    for (auto& [id, response] : answers) Answer(id, std::move(response));
    admitted.clear();
    answers.clear();
    Sweep();
    // Stopping with nothing left to write: the next TakeMail ends the loop
    // (a poll would sleep out the rest of the grace).
    if (stopping_seen_ && !Writing()) continue;
    PollOnce();
    Expire(GateNow());
    Sweep();
  }
  for (auto& [id, connection] : connections_) close(connection->fd);
  connections_.clear();
  AnnotatedMutexLock lock(&mu_);
  for (int fd : admitted_) close(fd);  // admitted after the last turn
  admitted_.clear();
}

bool HttpGate::TakeMail(std::vector<int>& admitted,
                        std::vector<std::pair<uint64_t, std::string>>& answers) {
  AnnotatedMutexLock lock(&mu_);
  finishing_seen_ = finishing_;
  finishing_acked_ = finishing_;
  stopping_seen_ = stopping_;
  // After Finish, Stop waits for what is being written, and for answers
  // handed over but not yet taken (a handler that ended just before Stop).
  if (stopping_ &&
      !(finishing_ && GateNow() < finish_deadline_ && (Writing() || !answers_.empty()))) {
    ended_ = true;
    return false;
  }
  poll_until_ = stopping_ ? finish_deadline_ : absl::InfiniteFuture();
  admitted.swap(admitted_);
  answers.swap(answers_);
  return true;
}

bool HttpGate::Writing() const {
  return std::any_of(connections_.begin(), connections_.end(), [](const auto& entry) {
    const Connection& c = *entry.second;
    return !c.done && (c.state == State::kWriting || (c.state == State::kLingering && c.answered));
  });
}

void HttpGate::Adopt(int fd) {
  MakeNonBlocking(fd);
  // Regular places and the probe reserve are counted apart: were a new
  // connection to take a probes-only one's place as a regular one, pairs of
  // a silent connection and a whole request would queue requests past
  // max_connections without bound (and a regular one would turn away a
  // kubelet's probe whose request has not arrived yet).
  bool probes_only = false;
  bool room = MakeRoom(/*probes_only=*/false);
  if (!room && options_.is_probe) {
    // Every place taken by a request being handled or answered: a probe may
    // still come (a kubelet's, which restarts the process when it fails).
    probes_only = true;
    room = MakeRoom(/*probes_only=*/true);
  }
  auto owned = std::make_unique<Connection>(next_id_++, fd, options_.limits);
  Connection& connection = *owned;
  connection.deadline = GateNow() + options_.request_timeout;
  connection.probes_only = probes_only;
  connections_.emplace(connection.id, std::move(owned));
  if (!room) Reject(connection, 503, "UNAVAILABLE", OverCapMessage(options_.max_connections));
}

bool HttpGate::MakeRoom(bool probes_only) {
  const size_t places = probes_only ? options_.probe_connections : options_.max_connections;
  // The oldest connection still sending its request makes room: clients
  // that hold connections without finishing a request (up to the cap,
  // reopening each as it times out) would otherwise turn every new one
  // away, /healthz probes included. A real request is whole within moments
  // of its connect, so it is never the oldest unfinished one for long; but
  // under a flood of connections the gate may adopt many in one turn,
  // before it has read any, so the oldest is read first: one whose request
  // has arrived (a probe sends its request with its connect) is handed off
  // instead of turned away. Read before judged, each candidate once.
  while (CountOpen(probes_only) >= places) {
    Connection* oldest = OldestReading(probes_only);
    if (oldest == nullptr) break;
    ReadAvailable(*oldest);
    if (oldest->done || oldest->state != State::kReading) continue;  // read: count again
    Reject(*oldest, 503, "UNAVAILABLE",
           absl::StrCat("the server has the most open connections it accepts (",
                        options_.max_connections,
                        ") and this request, the oldest unfinished one, made room for a new "
                        "connection; send requests whole, or retry later"));
    return true;
  }
  if (CountOpen(probes_only) < places) return true;
  if (probes_only) return false;
  // Else the oldest with bytes of its answer still to write: those can hold
  // places as long, while their client keeps taking bytes.
  // Its answer is cut off: it gets no 503 mid-answer.
  Connection* stalled = nullptr;
  for (auto& [id, open] : connections_) {
    if (open->done || open->probes_only || open->state != State::kWriting ||
        open->written >= open->out.size()) {
      continue;
    }
    if (stalled == nullptr || open->accepted < stalled->accepted) stalled = open.get();
  }
  if (stalled == nullptr) return false;
  stalled->done = true;  // closed by the next Sweep
  return true;
}

void HttpGate::Answer(uint64_t id, std::string response) {
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second->state != State::kHandling) return;
  Connection& connection = *it->second;
  if (response.empty()) {
    connection.done = true;
    return;
  }
  Send(connection, response);
  connection.state = State::kWriting;
  connection.answered = true;
  connection.deadline = GateNow() + options_.response_timeout;
  connection.progress = 0;
  Flush(connection);
  LimitUnsentBytes(connection);
}

void HttpGate::LimitUnsentBytes(const Connection& answered) {
  size_t unsent = 0;
  for (const auto& [id, open] : connections_) {
    if (!open->done) unsent += open->out.size() - open->written;
  }
  while (unsent > options_.max_unsent_response_bytes) {
    Connection* stalled = nullptr;
    for (auto& [id, open] : connections_) {
      if (open.get() == &answered || open->done || open->state != State::kWriting ||
          open->written >= open->out.size()) {
        continue;
      }
      if (stalled == nullptr || open->accepted < stalled->accepted) stalled = open.get();
    }
    if (stalled == nullptr) return;
    unsent -= stalled->out.size() - stalled->written;
    stalled->done = true;  // closed by the next Sweep: its answer cut off
    std::string().swap(stalled->out);
    stalled->written = 0;
  }
}

void HttpGate::PollOnce() {
  std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
  std::vector<Connection*> polled;
  absl::Time next_deadline = poll_until_;
  for (auto& [id, connection] : connections_) {
    next_deadline = std::min(next_deadline, connection->deadline);
    short events = connection->written < connection->out.size() ? POLLOUT : 0;
    if (connection->state == State::kReading || connection->state == State::kLingering) {
      events |= POLLIN;
    }
    if (events == 0) continue;  // kHandling: nothing to do until Respond
    fds.push_back({connection->fd, events, 0});
    polled.push_back(connection.get());
  }
  if (poll(fds.data(), fds.size(), PollTimeoutMillis(next_deadline, GateNow())) <= 0) return;
  if (fds[0].revents != 0) {
    uint64_t count;
    if (read(wake_fd_, &count, sizeof(count)) < 0) {}  // EAGAIN: already cleared
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0) OnEvents(*polled[i - 1], fds[i].revents);
  }
}

void HttpGate::OnEvents(Connection& connection, short revents) {
  if (revents & (POLLOUT | POLLERR | POLLHUP)) Flush(connection);
  if (connection.done || !(revents & (POLLIN | POLLERR | POLLHUP))) return;
  if (connection.state == State::kReading) {
    OnReadable(connection);
  } else if (connection.state == State::kLingering) {
    Drain(connection);
  }
}

bool HttpGate::OnReadable(Connection& connection) {
  char buffer[kReadChunk];
  const ssize_t n = recv(connection.fd, buffer, sizeof(buffer), 0);
  if (n < 0 && WouldBlock(errno)) return false;
  if (n <= 0) {  // the client closed or reset before its request was complete
    connection.done = true;
    return false;
  }
  connection.in.append(buffer, n);
  Frame(connection);
  return true;
}

void HttpGate::ReadAvailable(Connection& connection) {
  while (!connection.done && connection.state == State::kReading && OnReadable(connection)) {
  }
}

HttpGate::Connection* HttpGate::OldestReading(bool probes_only) {
  Connection* oldest = nullptr;
  for (auto& [id, open] : connections_) {
    if (open->done || open->state != State::kReading || open->probes_only != probes_only) continue;
    if (oldest == nullptr || open->accepted < oldest->accepted) oldest = open.get();
  }
  return oldest;
}

void HttpGate::Frame(Connection& connection) {
  switch (connection.framer.Update(connection.in)) {
    case HttpRequestFramer::Progress::kNeedMore:
      if (connection.framer.TakeContinue()) {
        Send(connection, kContinue);
        Flush(connection);
      }
      return;
    case HttpRequestFramer::Progress::kRejected: {
      const HttpRejection& why = connection.framer.rejection();
      Reject(connection, why.status, why.code, why.message);
      return;
    }
    case HttpRequestFramer::Progress::kComplete:
      HandOff(connection);
      return;
  }
}

void HttpGate::HandOff(Connection& connection) {
  if (finishing_seen_) {
    Reject(connection, 503, "UNAVAILABLE", "the server is shutting down; ask again shortly");
    return;
  }
  GatedRequest request;
  request.connection = connection.id;
  request.bytes = connection.in.substr(0, connection.framer.request_bytes());
  request.complete = GateNow();
  if (connection.probes_only && !options_.is_probe(request.bytes)) {
    Reject(connection, 503, "UNAVAILABLE", OverCapMessage(options_.max_connections));
    return;
  }
  std::string().swap(connection.in);
  Endpoint(connection.fd, /*peer=*/true, request.remote_ip, request.remote_port);
  Endpoint(connection.fd, /*peer=*/false, request.local_ip, request.local_port);
  connection.state = State::kHandling;
  connection.deadline = absl::InfiniteFuture();  // handlers are ours, not the client's
  dispatch_(std::move(request));
}

// Reads and discards what a client still sends after its answer, so that
// closing does not reset the connection before the client has read it.
void HttpGate::Drain(Connection& connection) {
  char buffer[kReadChunk];
  const ssize_t n = recv(connection.fd, buffer, sizeof(buffer), 0);
  if (n < 0 && WouldBlock(errno)) return;
  if (n <= 0) connection.done = true;  // the client has closed: so can we
}

void HttpGate::Send(Connection& connection, absl::string_view bytes) {
  connection.out.erase(0, connection.written);  // keeps what is still unwritten
  connection.written = 0;
  connection.out.append(bytes.data(), bytes.size());
}

void HttpGate::Flush(Connection& connection) {
  while (connection.written < connection.out.size()) {
    const ssize_t n = send(connection.fd, connection.out.data() + connection.written,
                           connection.out.size() - connection.written, MSG_NOSIGNAL);
    if (n < 0 && WouldBlock(errno)) return;  // POLLOUT resumes
    if (n < 0) {
      connection.done = true;
      return;
    }
    connection.written += n;
    // The response timeout bounds a stall, not the whole answer: a client
    // that keeps reading a large one (a plan with its drawings, tens of
    // MiB) over a slow link is not cut off while its bytes flow. Flowing
    // means kMinResponseProgressBytes a timeout: a client that opens its
    // window a segment at a time would otherwise hold its place for ever.
    connection.progress += static_cast<size_t>(n);
    if (connection.state == State::kWriting && connection.progress >= kMinResponseProgressBytes) {
      connection.deadline = GateNow() + options_.response_timeout;
      connection.progress = 0;
    }
  }
  std::string().swap(connection.out);
  connection.written = 0;
  if (connection.state == State::kWriting) StartLingering(connection);
  if (connection.state == State::kLingering && !connection.shut_down) {
    shutdown(connection.fd, SHUT_WR);
    connection.shut_down = true;
  }
}

void HttpGate::Reject(Connection& connection, int status, const std::string& code,
                      const std::string& message) {
  if (options_.on_reject)
    options_.on_reject(connection.in, status, GateNow() - connection.accepted);
  std::string().swap(connection.in);
  Send(connection, SerializeClosingResponse(JsonError(status, code, message)));
  StartLingering(connection);
  Flush(connection);
}

void HttpGate::StartLingering(Connection& connection) {
  // Lingering connections are capped too; beyond the cap a connection gets
  // one attempt to write its answer and is closed at once.
  const bool room = CountIn(State::kLingering) < options_.max_connections;
  connection.state = State::kLingering;
  connection.deadline = GateNow() + (room ? options_.linger : absl::ZeroDuration());
}

void HttpGate::Expire(absl::Time now) {
  for (auto& [id, connection] : connections_) {
    if (connection->done || connection->deadline > now) continue;
    if (connection->state == State::kReading) {
      Reject(*connection, 408, "DEADLINE_EXCEEDED",
             absl::StrCat("the request was not complete within the limit of ",
                          absl::FormatDuration(options_.request_timeout), " after connecting"));
    } else {
      connection->done = true;  // an answer the client did not read in time, or a linger
    }
  }
}

void HttpGate::Sweep() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second->done) {
      close(it->second->fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t HttpGate::CountIn(State state) const {
  return std::count_if(connections_.begin(), connections_.end(),
                       [state](const auto& entry) { return entry.second->state == state; });
}

size_t HttpGate::CountOpen(bool probes_only) const {
  // Connections marked done are closed at the end of this turn: not open.
  return std::count_if(connections_.begin(), connections_.end(), [probes_only](const auto& entry) {
    const Connection& c = *entry.second;
    return !c.done && c.state != State::kLingering && c.probes_only == probes_only;
  });
}

}  // namespace pipetrain
