// SilenceableRelay: a TCP relay for tests of peers that go silent.
//
// Relays every connection to 127.0.0.1:<target_port>. Freeze() stops it
// moving bytes but keeps every connection open, as a peer whose host
// powered off or was cut off without a reset looks to its clients (their
// calls wait for their deadlines; only keepalives notice). Bytes read
// while frozen are dropped (and counted), so a connection is never usable
// again.
//
// Thread-safe; the destructor closes every connection and joins its
// threads.
#ifndef PIPETRAIN_COMMON_TESTING_SILENCEABLE_RELAY_H_
#define PIPETRAIN_COMMON_TESTING_SILENCEABLE_RELAY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class SilenceableRelay {
 public:
  // Listens on an ephemeral port of 127.0.0.1 (a test failure if it
  // cannot).
  explicit SilenceableRelay(int target_port);
  ~SilenceableRelay();
  SilenceableRelay(const SilenceableRelay&) = delete;
  SilenceableRelay& operator=(const SilenceableRelay&) = delete;

  // "127.0.0.1:<port>" to connect to.
  std::string endpoint() const;
  void Freeze() { frozen_.store(true); }
  // Waits up to `timeout` until frozen connections have dropped at least
  // `bytes` (a call sent to the silent peer); false on timeout.
  bool AwaitDroppedBytes(int64_t bytes, absl::Duration timeout);

 private:
  void Accept();
  // Moves bytes from `from` to `to` until either end closes; frozen, what
  // is read is dropped (nothing arrives, nothing closes).
  void Pump(int from, int to);

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::thread accepter_;
  AnnotatedMutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;  // bytes read while frozen
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_SILENCEABLE_RELAY_H_
