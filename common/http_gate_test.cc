// HttpGate on its own, with sockets the test admits: many connections
// adopted in one turn of the gate's loop, unread answers past the bound,
// and a graceful stop.
#include "common/http_gate.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

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
