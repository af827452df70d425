// HttpGate on its own, with sockets the test admits: many connections
// adopted in one turn of the gate's loop, unread answers past the bound,
// and a graceful stop.
#include "common/http_gate.h"

#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// One end of a socket pair for the test (the client), the other for the
// gate; what the test end has sent is in the gate end's buffer at once.
struct Client {
  int fd = -1;  // the client's end
  int for_gate = -1;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  Client() {
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ends) == 0) fd = ends[0], for_gate = ends[1];
  }
  ~Client() {
    if (fd >= 0) close(fd);
  }
  bool Send(const std::string& bytes) const {
    return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size());
  }
  // Everything until the gate closes its side (blocking).
  std::string ReadToEnd() const {
    std::string out;
    char buffer[4096];
    ssize_t n;
    while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, n);
    return out;
  }
};

// A flood of new connections adopted in one turn, at the cap: a connection
// whose request had arrived whole was turned away (503, "the oldest
// unfinished one") before the gate had read it; 600 slow clients failed
// most /healthz probes this way. It is read first now, and handed off.
TEST(HttpGateTest, ManyAdoptedInOneTurn_ARequestAlreadyWholeIsHandledNotTurnedAway) {
  AnnotatedMutex mu;
  std::vector<std::string> dispatched;
  absl::Notification holding, release;
  HttpGate* gate_ptr = nullptr;
  auto gate = HttpGate::Start({.max_connections = 2}, [&](GatedRequest request) {
    const bool first = [&] {
      AnnotatedMutexLock lock(&mu);
      dispatched.push_back(request.bytes);
      return dispatched.size() == 1;
    }();
    if (first) {
      // Holds the gate's thread (against Dispatch's contract, on
      // purpose) so that the connections below are all adopted in its
      // next turn, before it polls any of them.
      holding.Notify();
      release.WaitForNotification();
      return;
    }
    gate_ptr->Respond(request.connection,
                      "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  ASSERT_TRUE(gate.ok()) << gate.status();
  gate_ptr = gate->get();
  Client held;
  ASSERT_TRUE(held.Send("GET /held HTTP/1.1\r\nHost: t\r\n\r\n"));
  (*gate)->Admit(held.for_gate);
  holding.WaitForNotification();
  // While the gate's thread is held: a probe whose request is whole, then
  // more unfinished requests than there are places.
  Client probe;
  ASSERT_TRUE(probe.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"));
  (*gate)->Admit(probe.for_gate);
  std::vector<Client> slow(3);
  for (Client& client : slow) {
    ASSERT_TRUE(client.Send("GET /slow HTTP/1.1\r\nHost: t\r\n"));
    (*gate)->Admit(client.for_gate);
  }
  release.Notify();
  const std::string answer = probe.ReadToEnd();
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK", 0), 0u) << answer;
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_EQ(dispatched.size(), 2u);
    EXPECT_EQ(dispatched[1], "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
  }
  // The unfinished ones had no place: each is turned away.
  for (const Client& client : slow) {
    const std::string refused = client.ReadToEnd();
    EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  }
  (*gate)->Stop();
}

// Clients that ask for large answers and never read them: the answers
// not yet written are bounded in bytes, so a newer answer cuts off the
// oldest unread one; an answer alone above the bound is still sent whole.
TEST(HttpGateTest, UnsentAnswersPastTheBound_OldestUnreadCutOff) {
  AnnotatedMutex mu;
  std::vector<uint64_t> connections;
  auto gate = HttpGate::Start({.max_unsent_response_bytes = 1 << 20}, [&](GatedRequest request) {
    AnnotatedMutexLock lock(&mu);
    connections.push_back(request.connection);
  });
  ASSERT_TRUE(gate.ok()) << gate.status();
  Client first, second;
  for (const Client* client : {&first, &second}) {
    ASSERT_TRUE(client->Send("GET /big HTTP/1.1\r\nHost: t\r\n\r\n"));
    (*gate)->Admit(client->for_gate);
    AnnotatedMutexLock lock(&mu);  // handed off in order: one at a time
    const size_t expected = client == &first ? 1 : 2;
    ASSERT_TRUE(
        mu.AwaitWithTimeout([&] { return connections.size() == expected; }, absl::Seconds(30)));
  }
  // Each answer is far beyond a socket's buffer, and beyond the bound.
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\nConnection: close\r\n\r\n";
  const std::string answer = head + std::string(4 << 20, 'x');
  (*gate)->Respond(connections[0], answer);
  (*gate)->Respond(connections[1], answer);
  // The newer answer is whole; reading it to its end means the gate has
  // taken it, and with it cut off the older one, unread until now.
  EXPECT_EQ(second.ReadToEnd().size(), answer.size());
  const std::string cut = first.ReadToEnd();
  EXPECT_LT(cut.size(), answer.size());
  EXPECT_EQ(cut.rfind("HTTP/1.1 200 OK", 0), 0u);
  (*gate)->Stop();
}

// A client reading a large answer slowly, but steadily: the response
// timeout (1 s here) bounds a stall, not the whole answer, so one that
// takes ~3 s to read arrives whole. It was cut off at the timeout, and a
// plan with its drawings (tens of MiB) never reached a slow client.
TEST(HttpGateTest, SlowSteadyReader_LargeAnswerNotCutAtTheResponseTimeout) {
  AnnotatedMutex mu;
  std::vector<uint64_t> connections;
  auto gate = HttpGate::Start({.response_timeout = absl::Seconds(1)}, [&](GatedRequest request) {
    AnnotatedMutexLock lock(&mu);
    connections.push_back(request.connection);
  });
  ASSERT_TRUE(gate.ok()) << gate.status();
  Client client;
  ASSERT_TRUE(client.Send("GET /big HTTP/1.1\r\nHost: t\r\n\r\n"));
  (*gate)->Admit(client.for_gate);
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return connections.size() == 1; }, absl::Seconds(30)));
  }
  const std::string answer =
      "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\nConnection: close\r\n\r\n" +
      std::string(4 << 20, 'x');
  (*gate)->Respond(connections[0], answer);
  // 32 reads of at most 128 KiB, 100 ms apart: a pace, not a synchronisation.
  std::string got;
  std::vector<char> buffer(128 << 10);
  ssize_t n;
  while ((n = recv(client.fd, buffer.data(), buffer.size(), 0)) > 0) {
    got.append(buffer.data(), n);
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(got.size(), answer.size());
  (*gate)->Stop();
}

// A client that takes a few bytes at a time (1 KiB every 100 ms, far below
// kMinResponseProgressBytes a second) does not hold its place for ever:
// cut at the response timeout, as each write of a byte restarted it.
TEST(HttpGateTest, TrickleReader_CutAtTheResponseTimeout) {
  AnnotatedMutex mu;
  std::vector<uint64_t> connections;
  auto gate = HttpGate::Start({.response_timeout = absl::Seconds(1)}, [&](GatedRequest request) {
    AnnotatedMutexLock lock(&mu);
    connections.push_back(request.connection);
  });
  ASSERT_TRUE(gate.ok()) << gate.status();
  Client client;
  // A small send buffer on the gate's end, so that each KiB the client
  // takes lets the gate write a little (a socket pair's end is writable
  // only once most of its buffer is free): bytes keep moving, slowly.
  const int small = 4096;
  ASSERT_EQ(setsockopt(client.for_gate, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  ASSERT_TRUE(client.Send("GET /big HTTP/1.1\r\nHost: t\r\n\r\n"));
  (*gate)->Admit(client.for_gate);
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return connections.size() == 1; }, absl::Seconds(30)));
  }
  const std::string answer =
      "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\nConnection: close\r\n\r\n" +
      std::string(4 << 20, 'x');
  (*gate)->Respond(connections[0], answer);
  // 3 s of trickling (a pace, not a synchronisation), then the rest as
  // fast as it comes: whole only if the gate kept the connection.
  std::string got;
  char buffer[1024];
  ssize_t n = 1;
  for (int i = 0; i < 30 && n > 0; ++i) {
    n = recv(client.fd, buffer, sizeof(buffer), 0);
    if (n > 0) got.append(buffer, n);
    absl::SleepFor(absl::Milliseconds(100));
  }
  got += client.ReadToEnd();
  EXPECT_LT(got.size(), answer.size());
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK", 0), 0u);
  (*gate)->Stop();
}

constexpr char kOk[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

// A gate at its cap (max_connections = 1) with its one place taken by a
// request being handled (dispatched first, never answered); every later
// request is answered 200 at once. Probes are GET /healthz.
class FullGate {
 public:
  explicit FullGate(size_t probe_connections) {
    HttpGate::Options options{.max_connections = 1, .probe_connections = probe_connections};
    options.is_probe = [](absl::string_view request) {
      return absl::StartsWith(request, "GET /healthz ");
    };
    auto started = HttpGate::Start(std::move(options), [this](GatedRequest request) {
      AnnotatedMutexLock lock(&mu_);
      dispatched_.push_back(request.bytes);
      if (dispatched_.size() > 1) gate_->Respond(request.connection, kOk);
    });
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) gate_ = std::move(*started);
  }
  ~FullGate() {
    if (gate_ != nullptr) gate_->Stop();
  }

  // Admits `held`, whose request is whole, and waits until it is dispatched.
  bool Fill(const Client& held) {
    if (gate_ == nullptr || !held.Send("GET /held HTTP/1.1\r\nHost: t\r\n\r\n")) return false;
    gate_->Admit(held.for_gate);
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !dispatched_.empty(); },
        absl::Seconds(30));
  }
  void Admit(const Client& client) { gate_->Admit(client.for_gate); }
  std::vector<std::string> dispatched() {
    AnnotatedMutexLock lock(&mu_);
    return dispatched_;
  }

 private:
  AnnotatedMutex mu_;
  std::vector<std::string> dispatched_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HttpGate> gate_;  // set before any request can arrive
};

// A kubelet's probe connects, and its request arrives a moment later. Its
// connection, admitted for probes only (every place taken), was the oldest
// unfinished reader, so the next regular connection turned it away (503)
// and took a regular place: the probe failed, and each such pair queued one
// more request past max_connections. The two kinds of place are apart now:
// the regular connection finds no place and gets a probes-only one (503,
// its request being no probe), and the probe is answered.
TEST(HttpGateTest, AtCap_RegularConnectionDoesNotEvictAProbesOnlyReader) {
  FullGate gate(/*probe_connections=*/8);
  Client held, probe, regular;
  ASSERT_TRUE(gate.Fill(held));
  gate.Admit(probe);  // nothing sent yet
  ASSERT_TRUE(regular.Send("GET /work HTTP/1.1\r\nHost: t\r\n\r\n"));
  gate.Admit(regular);
  const std::string refused = regular.ReadToEnd();
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  EXPECT_NE(refused.find("the most open connections it accepts (1); retry later"),
            std::string::npos)
      << refused;
  ASSERT_TRUE(probe.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(probe.ReadToEnd(), kOk);
  EXPECT_EQ(gate.dispatched(),
            (std::vector<std::string>{"GET /held HTTP/1.1\r\nHost: t\r\n\r\n",
                                      "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"}));
}

// The probe reserve full of connections that send nothing: a new one takes
// the place of the oldest of them (503), for probes only too.
TEST(HttpGateTest, ProbeReserveFull_OldestProbesOnlyReaderMakesRoom) {
  FullGate gate(/*probe_connections=*/1);
  Client held, silent, probe, regular;
  ASSERT_TRUE(gate.Fill(held));
  gate.Admit(silent);  // the reserve's one place
  ASSERT_TRUE(probe.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"));
  gate.Admit(probe);
  EXPECT_EQ(probe.ReadToEnd(), kOk);
  const std::string evicted = silent.ReadToEnd();
  EXPECT_EQ(evicted.rfind("HTTP/1.1 503", 0), 0u) << evicted;
  EXPECT_NE(evicted.find("the oldest unfinished one, made room"), std::string::npos) << evicted;
  // The place it took was a probes-only one.
  ASSERT_TRUE(regular.Send("GET /work HTTP/1.1\r\nHost: t\r\n\r\n"));
  gate.Admit(regular);
  const std::string refused = regular.ReadToEnd();
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  EXPECT_EQ(gate.dispatched().size(), 2u);
}

// A graceful stop (HttpServer::Stop with a grace): after Finish, a request
// that arrives whole is turned away (503) and not dispatched; a request
// dispatched before is still answered, even when its answer is handed
// over just before Stop, so Stop must take it and write it.
TEST(HttpGateTest, Finish_NewRequestsTurnedAway_AnswerHandedOverBeforeStopIsWritten) {
  AnnotatedMutex mu;
  std::vector<GatedRequest> dispatched;
  auto gate = HttpGate::Start({}, [&](GatedRequest request) {
    AnnotatedMutexLock lock(&mu);
    dispatched.push_back(std::move(request));
  });
  ASSERT_TRUE(gate.ok()) << gate.status();
  Client taken, late;
  ASSERT_TRUE(taken.Send("GET /taken HTTP/1.1\r\nHost: t\r\n\r\n"));
  (*gate)->Admit(taken.for_gate);
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return dispatched.size() == 1; }, absl::Seconds(30)));
  }
  ASSERT_TRUE(late.Send("GET /late HTTP/1.1\r\nHost: t\r\n"));  // not whole yet
  (*gate)->Admit(late.for_gate);
  (*gate)->Finish(MonotonicClock()->Now() + absl::Seconds(30));
  ASSERT_TRUE(late.Send("\r\n"));  // whole now, after Finish
  const std::string refused = late.ReadToEnd();
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  EXPECT_NE(refused.find("shutting down"), std::string::npos) << refused;
  uint64_t connection;
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_EQ(dispatched.size(), 1u);  // the late request was not dispatched
    connection = dispatched[0].connection;
  }
  (*gate)->Respond(connection, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  (*gate)->Stop();  // at once: the answer is still in the gate's mail
  const std::string answer = taken.ReadToEnd();
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK", 0), 0u) << answer;
}

}  // namespace
}  // namespace pipetrain
