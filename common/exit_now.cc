#include "common/exit_now.h"

#include <pthread.h>
#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "common/logging.h"

namespace pipetrain {
namespace {

// The timer: a thread of its own rather than alarm(), which would take
// SIGALRM's disposition from whatever else uses it.
void* ExitAfterGrace(void* code) {
  timespec left = absl::ToTimespec(kExitNowGrace);
  while (nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
  std::_Exit(static_cast<int>(reinterpret_cast<intptr_t>(code)));
}

}  // namespace

void ExitNow(int code, const std::string& message, const char* file, int line) {
  // pthread_create, not std::thread: a thread that cannot start must not
  // throw on the way out; the exit then goes without the line.
  pthread_t timer;
  if (pthread_create(&timer, nullptr, ExitAfterGrace,
                     reinterpret_cast<void*>(static_cast<intptr_t>(code))) == 0) {
    pthread_detach(timer);
    LogMessage(file, line, LogSeverity::kError).stream() << message;
  }
  std::_Exit(code);
}

}  // namespace pipetrain
