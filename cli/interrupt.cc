#include "cli/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>  // std::call_once
#include <set>
#include <thread>

#include "common/annotated_mutex.h"

namespace pipetrain {
namespace {

std::atomic<int> g_signal{0};
// Written by the handler (write(2) is async-signal-safe), read by the
// watcher thread, which cancels the registered calls.
std::atomic<int> g_wake_write{-1};

// The calls in flight that an interrupt cancels.
struct Calls {
  AnnotatedMutex mu;
  std::set<grpc::ClientContext*> contexts ABSL_GUARDED_BY(mu);
};
Calls& InFlight() {
  static Calls* const calls = new Calls;  // never destroyed: the watcher outlives main
  return *calls;
}

void CancelCalls() {
  Calls& calls = InFlight();
  AnnotatedMutexLock lock(&calls.mu);
  for (grpc::ClientContext* context : calls.contexts) context->TryCancel();
}

extern "C" void OnInterruptSignal(int signal) {
  g_signal.store(signal);  // the latest, as a shell reports the one that ended it
  if (const int wake = g_wake_write.load(); wake >= 0) {
    const int saved = errno;
    const char byte = 1;
    (void)!write(wake, &byte, 1);  // a full pipe has a wake pending
    errno = saved;
  }
}

void StartWatcher() {
  static std::once_flag once;
  std::call_once(once, [] {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return;  // calls then wait out their deadlines
    const int read_end = fds[0];
    // Blocking reads; the handler's writes stay non-blocking.
    fcntl(read_end, F_SETFL, fcntl(read_end, F_GETFL) & ~O_NONBLOCK);
    g_wake_write.store(fds[1]);
    std::thread([read_end] {
      char byte;
      while (true) {
        const ssize_t n = read(read_end, &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        CancelCalls();
      }
    }).detach();
  });
}

}  // namespace

void CatchInterrupt(int signal, bool unless_ignored) {
  if (unless_ignored) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) return;
  }
  StartWatcher();
  struct sigaction action {};
  action.sa_handler = OnInterruptSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(signal, &action, nullptr);
}

void Interrupt(int signal) {
  g_signal.store(signal);
  CancelCalls();
}

bool Interrupted() { return g_signal.load() != 0; }

int InterruptSignal() { return g_signal.load(); }

CancelOnInterrupt::CancelOnInterrupt(grpc::ClientContext* context) : context_(context) {
  Calls& calls = InFlight();
  AnnotatedMutexLock lock(&calls.mu);
  calls.contexts.insert(context_);
  if (Interrupted()) context_->TryCancel();
}

CancelOnInterrupt::~CancelOnInterrupt() {
  Calls& calls = InFlight();
  AnnotatedMutexLock lock(&calls.mu);
  calls.contexts.erase(context_);
}

}  // namespace pipetrain
