// The names of the signals the daemons shut down on, for their logs.
#ifndef PIPETRAIN_COMMON_SIGNAL_NAMES_H_
#define PIPETRAIN_COMMON_SIGNAL_NAMES_H_

#include <csignal>

namespace pipetrain {

// "SIGINT", "SIGTERM", "SIGHUP", or "a signal" for any other.
inline const char* ShutdownSignalName(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SIGNAL_NAMES_H_
