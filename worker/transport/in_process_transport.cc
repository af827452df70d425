#include "worker/transport/in_process_transport.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {
namespace {

// A copy that shares no storage with `wire` (Tensor copies share theirs), so
// the sender may reuse its tensor as soon as Send returns.
WireTensor Copy(const WireTensor& wire) {
  if (wire.encoded()) return WireTensor::Encoded(wire.codec, wire.payload, wire.shape);
  return WireTensor::Raw(wire.tensor.Clone());
}

class InProcessTransport : public Transport {
 public:
  InProcessTransport(InProcessFabric* fabric, int stage) : fabric_(fabric), stage_(stage) {}
  int stage() const override { return stage_; }

  absl::Status SendWire(int peer_stage, const TensorAddress& address,
                        const WireTensor& wire) override {
    if (peer_stage < 0 || peer_stage >= fabric_->num_stages()) {
      return absl::UnavailableError(absl::StrCat("no stage ", peer_stage));
    }
    return fabric_->mailbox(peer_stage).Put(stage_, address, Copy(wire));
  }

  absl::StatusOr<WireTensor> RecvWire(int peer_stage, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return fabric_->mailbox(stage_).Take(peer_stage, address, timeout);
  }

 private:
  InProcessFabric* fabric_;
  int stage_;
};

}  // namespace

InProcessFabric::InProcessFabric(int num_stages) {
  for (int i = 0; i < num_stages; ++i) mailboxes_.push_back(std::make_unique<Mailbox>());
}

std::unique_ptr<Transport> InProcessFabric::Connect(int stage) {
  PT_CHECK(stage >= 0 && stage < num_stages()) << "stage " << stage;
  return std::make_unique<InProcessTransport>(this, stage);
}

void InProcessFabric::Shutdown() {
  for (auto& m : mailboxes_) m->Shutdown();
}

}  // namespace pipetrain
