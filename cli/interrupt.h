// Ctrl-C and its kin for the commands that call a coordinator (submit
// --follow, up): a caught signal is recorded, the command ends its loop,
// and a call in flight is cancelled at once rather than left to wait out
// its deadline (--timeout, per call; a coordinator whose host is gone
// answers nothing, and each Ctrl-C was swallowed until the deadline passed).
//
// CatchInterrupt installs the handler; Interrupted() says whether one came;
// a CancelOnInterrupt around a call cancels it (grpc::ClientContext::
// TryCancel, from a thread of this file's: a signal handler may not) when
// a signal comes while it is alive, or came before.
//
// Thread-safe. The watcher thread starts with the first CatchInterrupt and
// lives as long as the process.
#ifndef PIPETRAIN_CLI_INTERRUPT_H_
#define PIPETRAIN_CLI_INTERRUPT_H_

#include <grpcpp/client_context.h>

namespace pipetrain {

// Catches `signal` (SIGINT, SIGTERM, SIGHUP, SIGPIPE): the latest caught
// is what InterruptSignal() returns. Unless ignored: with
// `unless_ignored`, a signal whose disposition is SIG_IGN stays ignored
// (`nohup` ignores SIGHUP so that a run outlives its terminal).
void CatchInterrupt(int signal, bool unless_ignored = false);
// Records `signal` as if it had been caught (a closed stdout found
// otherwise), cancelling the calls in flight.
void Interrupt(int signal);
bool Interrupted();
// The signal that interrupted, 0 while none did.
int InterruptSignal();

// While alive, an interrupt cancels `context`'s call; one that came before
// cancels it at once. `context` must outlive this object.
class CancelOnInterrupt {
 public:
  explicit CancelOnInterrupt(grpc::ClientContext* context);
  ~CancelOnInterrupt();
  CancelOnInterrupt(const CancelOnInterrupt&) = delete;
  CancelOnInterrupt& operator=(const CancelOnInterrupt&) = delete;

 private:
  grpc::ClientContext* const context_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_INTERRUPT_H_
