// Test helper: connections to a local HTTP server that begin a request and
// never finish it, the "slowloris" attack a server must withstand. Some
// send the head of a GET one byte at a time (the trickle), the others send
// nothing at all.
//
//   auto slow = SlowHttpClients::Open(port, {.connections = 64, .trickling = 48});
//   ASSERT_TRUE(slow.ok()) << slow.status();
//   ... a request on a new connection must still be answered ...
//   EXPECT_EQ((*slow)->CountAnsweredOrClosed(), 0);  // all still held open
//
// Not thread-safe (one test thread uses it); the trickle runs on a thread
// of its own.
#ifndef PIPETRAIN_COMMON_SLOW_HTTP_CLIENTS_H_
#define PIPETRAIN_COMMON_SLOW_HTTP_CLIENTS_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class SlowHttpClients {
 public:
  struct Options {
    int connections = 64;
    int trickling = 48;  // the first `trickling` connections trickle; the rest are silent
    absl::Duration interval = absl::Milliseconds(100);  // between two bytes of one connection
  };

  // Connects every connection to 127.0.0.1:`port` (blocking, so each is
  // established when Open returns) and sends each trickling one its first
  // byte. Errors: UNAVAILABLE naming the connection that failed.
  static absl::StatusOr<std::unique_ptr<SlowHttpClients>> Open(int port, Options options);
  ~SlowHttpClients();  // stops the trickle, closes every connection
  SlowHttpClients(const SlowHttpClients&) = delete;
  SlowHttpClients& operator=(const SlowHttpClients&) = delete;

  // How many connections the server has answered (bytes to read) or closed,
  // seen now, without waiting.
  int CountAnsweredOrClosed() const;

  // Waits until the server has answered or closed every connection, or
  // `timeout` passed; returns how many it has.
  int AwaitAnsweredOrClosed(absl::Duration timeout) const;

 private:
  explicit SlowHttpClients(Options options) : options_(options) {}
  void SendNextByte(size_t index);
  void Trickle();

  const Options options_;
  std::vector<int> fds_;  // written by Open only, before the trickle starts
  AnnotatedMutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread trickle_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SLOW_HTTP_CLIENTS_H_
