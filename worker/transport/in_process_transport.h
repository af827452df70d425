// Transport between stages in one process: SendWire copies the WireTensor
// (a raw tensor's data, or an encoded one's codec, payload and shape)
// straight into the destination stage's mailbox; RecvWire returns it as sent. Used by tests and by
// the single-process equivalence check; no serialisation, same semantics as the gRPC data plane.
#ifndef PIPETRAIN_WORKER_TRANSPORT_IN_PROCESS_TRANSPORT_H_
#define PIPETRAIN_WORKER_TRANSPORT_IN_PROCESS_TRANSPORT_H_

#include <memory>
#include <vector>

#include "worker/transport/mailbox.h"
#include "worker/transport/transport.h"

namespace pipetrain {

// The shared fabric: one mailbox per stage. Thread-safe.
class InProcessFabric {
 public:
  explicit InProcessFabric(int num_stages);
  std::unique_ptr<Transport> Connect(int stage);  // requires 0 <= stage < num_stages
  void Shutdown();                                // aborts every waiting Recv
  int num_stages() const { return static_cast<int>(mailboxes_.size()); }
  Mailbox& mailbox(int stage) { return *mailboxes_[stage]; }

 private:
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_IN_PROCESS_TRANSPORT_H_
