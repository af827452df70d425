#include "common/slow_http_clients.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

// A head that never ends: after these bytes, an endless header value.
constexpr char kHeadStart[] = "GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Slow: ";

absl::StatusOr<int> Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect to 127.0.0.1:", port, ": ", std::strerror(error)));
  }
  const int yes = 1;  // each byte in a segment of its own, as a trickler sends it
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  return fd;
}

// Answered (readable bytes) or closed (EOF or reset) by the server.
bool AnsweredOrClosed(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SlowHttpClients>> SlowHttpClients::Open(int port,
                                                                        Options options) {
  std::unique_ptr<SlowHttpClients> clients(new SlowHttpClients(options));
  for (int i = 0; i < options.connections; ++i) {
    absl::StatusOr<int> fd = Connect(port);
    if (!fd.ok()) {
      return absl::UnavailableError(
          absl::StrCat("slow connection ", i, " of ", options.connections, ": ", fd.status().message()));
    }
    clients->fds_.push_back(*fd);
  }
  clients->SendNextByte(0);
  clients->trickle_ = std::thread([raw = clients.get()] { raw->Trickle(); });
  return clients;
}

SlowHttpClients::~SlowHttpClients() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  if (trickle_.joinable()) trickle_.join();
  for (int fd : fds_) close(fd);
}

void SlowHttpClients::SendNextByte(size_t index) {
  const size_t prefix = sizeof(kHeadStart) - 1;
  const char byte = index < prefix ? kHeadStart[index] : 'a';
  for (int i = 0; i < options_.trickling && i < static_cast<int>(fds_.size()); ++i) {
    // Errors are the server closing the connection: CountAnsweredOrClosed sees them.
    send(fds_[i], &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void SlowHttpClients::Trickle() {
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  for (size_t next = 1;; ++next) {
    {
      AnnotatedMutexLock lock(&mu_);
      // The trickle's pace, not synchronisation: wakes early only to stop.
      if (mu_.AwaitWithTimeout(stopping, options_.interval)) return;
    }
    SendNextByte(next);
  }
}

int SlowHttpClients::CountAnsweredOrClosed() const {
  int count = 0;
  for (int fd : fds_) count += AnsweredOrClosed(fd) ? 1 : 0;
  return count;
}

int SlowHttpClients::AwaitAnsweredOrClosed(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<pollfd> waiting;
  for (int fd : fds_) waiting.push_back({fd, POLLIN, 0});
  while (!waiting.empty() && absl::Now() < deadline) {
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now())) + 1;
    if (poll(waiting.data(), waiting.size(), ms) < 0 && errno != EINTR) break;
    waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                 [](const pollfd& p) { return p.revents != 0; }),
                  waiting.end());
  }
  return static_cast<int>(fds_.size() - waiting.size());
}

}  // namespace pipetrain
