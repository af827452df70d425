#include "common/testing/silenceable_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {

SilenceableRelay::SilenceableRelay(int target_port) : target_port_(target_port) {
  listener_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      listen(listener_, 16) != 0 ||
      getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    ADD_FAILURE() << "relay: cannot listen";
    return;
  }
  port_ = ntohs(address.sin_port);
  accepter_ = std::thread([this] { Accept(); });
}

SilenceableRelay::~SilenceableRelay() {
  shutdown(listener_, SHUT_RDWR);
  if (accepter_.joinable()) accepter_.join();
  std::vector<std::thread> pumps;
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);  // ends their reads
    pumps = std::move(pumps_);
  }
  for (std::thread& t : pumps) t.join();
  AnnotatedMutexLock lock(&mu_);
  for (int fd : fds_) close(fd);
  close(listener_);
}

std::string SilenceableRelay::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

bool SilenceableRelay::AwaitDroppedBytes(int64_t bytes, absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return dropped_ >= bytes; }, timeout);
}

void SilenceableRelay::Accept() {
  while (true) {
    const int client = accept(listener_, nullptr, nullptr);
    if (client < 0) return;  // shut down
    const int upstream = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(target_port_);
    if (upstream < 0 ||
        connect(upstream, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      close(client);
      if (upstream >= 0) close(upstream);
      continue;
    }
    AnnotatedMutexLock lock(&mu_);
    if (stopping_) {
      close(client);
      close(upstream);
      return;
    }
    fds_.push_back(client);
    fds_.push_back(upstream);
    pumps_.emplace_back([this, client, upstream] { Pump(client, upstream); });
    pumps_.emplace_back([this, client, upstream] { Pump(upstream, client); });
  }
}

void SilenceableRelay::Pump(int from, int to) {
  char buffer[16384];
  while (true) {
    const ssize_t n = read(from, buffer, sizeof buffer);
    if (n <= 0) return;
    if (frozen_.load()) {
      AnnotatedMutexLock lock(&mu_);
      dropped_ += n;
      continue;
    }
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = write(to, buffer + done, n - done);
      if (w <= 0) return;
      done += w;
    }
  }
}

}  // namespace pipetrain
