// A device backend's error (backend.h: the first one sticks, status()
// returns it) fails the instruction that hit it, naming the stage, the
// iteration and the instruction, and the iteration's background sends are
// drained first. The CPU backend cannot fail, so a stand-in reports an
// error once the stage has run a given number of GELU forward passes (one
// per MLP unit and micro-batch).
#include <atomic>
#include <memory>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

class FailsAfterGelus : public ForwardingBackend {
 public:
  explicit FailsAfterGelus(int healthy) : ForwardingBackend(CpuBackend()), healthy_(healthy) {}
  void GeluForward(const float* x, int64_t n, float* y) override {
    ++gelus_;
    inner()->GeluForward(x, n, y);
  }
  absl::Status status() const override {
    if (gelus_.load() > healthy_) return absl::InternalError("an illegal memory access");
    return absl::OkStatus();
  }

 private:
  const int healthy_;
  std::atomic<int> gelus_{0};
};

TEST(StageRuntimeBackendErrorTest, BackendError_FailsTheInstructionThatHitIt) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  // One stage holding the whole model: forward units [0, end), micro-batch
  // k's forward runs mlp_0 and mlp_1 (two GELUs). The third GELU is in
  // micro-batch 1's forward pass.
  const int units = NumUnits(c.model);
  auto programs = CompilePrograms({{0, units}}, units, c.micro_batches, Schedule::kOneFOneB);
  ASSERT_TRUE(programs.ok()) << programs.status();
  InProcessFabric fabric(1);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  FailsAfterGelus backend(/*healthy=*/2);
  StageSetup setup{"job-err", c, 0, 1, ToUnitRange({0, units}), ToUnitRange({0, units}),
                   (*programs)[0], absl::Seconds(5)};
  setup.backend = &backend;
  auto runtime = StageRuntime::Create(setup, &data, transport.get());
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  absl::StatusOr<IterationResult> result = (*runtime)->RunIteration(0);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "stage 0, iteration 0, 'forward"))
      << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "mb 1")) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "an illegal memory access"))
      << result.status();
  // The error sticks: the next iteration fails at its first instruction.
  result = (*runtime)->RunIteration(1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "iteration 1, 'forward"))
      << result.status();
}

// Healthy for its first `healthy` status() calls, failed from then on: a
// device fault the step's last wait (reading the losses) is the first to
// see.
class FailsAfterStatusCalls : public ForwardingBackend {
 public:
  explicit FailsAfterStatusCalls(int healthy)
      : ForwardingBackend(CpuBackend()), healthy_(healthy) {}
  absl::Status status() const override {
    if (++calls_ > healthy_) return absl::InternalError("an illegal memory access");
    return absl::OkStatus();
  }
  int calls() const { return calls_.load(); }

 private:
  const int healthy_;
  mutable std::atomic<int> calls_{0};
};

// A fault seen only once every instruction has run (when the losses are
// read) fails the iteration, naming where: its losses (NaN on a device)
// would otherwise be reported, and read as a diverged model.
TEST(StageRuntimeBackendErrorTest, FaultSeenWhenTheLossesAreRead_FailsTheIteration) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const int units = NumUnits(c.model);
  auto programs = CompilePrograms({{0, units}}, units, c.micro_batches, Schedule::kOneFOneB);
  ASSERT_TRUE(programs.ok()) << programs.status();
  const auto run = [&](Backend* backend) {
    InProcessFabric fabric(1);
    std::unique_ptr<Transport> transport = fabric.Connect(0);
    StageSetup setup{
        "job-err",       c, 0, 1, ToUnitRange({0, units}), ToUnitRange({0, units}), (*programs)[0],
        absl::Seconds(5)};
    setup.backend = backend;
    auto runtime = StageRuntime::Create(setup, &data, transport.get());
    EXPECT_TRUE(runtime.ok()) << runtime.status();
    return runtime.ok() ? (*runtime)->RunIteration(0)
                        : absl::StatusOr<IterationResult>(runtime.status());
  };
  FailsAfterStatusCalls counting(/*healthy=*/1 << 30);
  ASSERT_TRUE(run(&counting).ok());
  // Healthy for every check but the iteration's last.
  FailsAfterStatusCalls backend(counting.calls() - 1);
  absl::StatusOr<IterationResult> result = run(&backend);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(),
                                "stage 0, iteration 0, after its instructions: an illegal memory"))
      << result.status();
}

// Fails after `healthy` GELU backward passes (one per MLP unit and
// micro-batch); `failed` is notified once status() has said so.
class FailsAfterGeluBackwards : public ForwardingBackend {
 public:
  explicit FailsAfterGeluBackwards(int healthy)
      : ForwardingBackend(CpuBackend()), healthy_(healthy) {}
  void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    ++gelus_;
    inner()->GeluBackward(x, dy, n, dx);
  }
  absl::Status status() const override {
    if (gelus_.load() <= healthy_) return absl::OkStatus();
    if (!failed.HasBeenNotified()) failed.Notify();
    return absl::InternalError("an illegal memory access");
  }
  mutable absl::Notification failed;

 private:
  const int healthy_;
  std::atomic<int> gelus_{0};
};

// The other replica is gone: every collective message fails, once the
// backend's failure has been reported (so the sums queued before it are
// still pending when the interpreter sees it).
class GoneReplicaTransport : public Transport {
 public:
  GoneReplicaTransport(std::unique_ptr<Transport> inner, const absl::Notification* after)
      : inner_(std::move(inner)), after_(after) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    if (address.kind == v1::TENSOR_KIND_COLLECTIVE) return Gone();
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    if (address.kind == v1::TENSOR_KIND_COLLECTIVE) return Gone();
    return inner_->RecvWire(peer, address, timeout);
  }

 private:
  absl::Status Gone() const {
    after_->WaitForNotificationWithTimeout(absl::Seconds(30));  // bounded if the test is wrong
    return absl::UnavailableError("replica 1 is gone");
  }
  std::unique_ptr<Transport> inner_;
  const absl::Notification* after_;
};

// Replica 0 of 2, its gradients all-reduced unit by unit as the last
// backward pass finishes them (in the background): a backend error in that
// pass fails it, and the failed all-reduces it queued are drained into the
// error too, as the sends are, instead of being left running behind it.
TEST(StageRuntimeBackendErrorTest, BackendErrorWithAllReducesQueued_DrainsAndNamesThem) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const int units = NumUnits(c.model);
  // Each replica runs 2 of the 4 micro-batches; the third GELU backward is
  // in micro-batch 1's, the last, after the head's all-reduce was queued.
  auto programs = CompilePrograms({{0, units}}, units, 2, Schedule::kOneFOneB);
  ASSERT_TRUE(programs.ok()) << programs.status();
  FailsAfterGeluBackwards backend(/*healthy=*/2);
  InProcessFabric fabric(2);
  GoneReplicaTransport transport(fabric.Connect(0), &backend.failed);
  StageSetup setup{
      "job-err",       c, 0, 1, ToUnitRange({0, units}), ToUnitRange({0, units}), (*programs)[0],
      absl::Seconds(5)};
  setup.backend = &backend;
  setup.replicas = 2;
  setup.data_parallel_bucket_bytes = 1;  // one all-reduce per unit
  auto runtime = StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  absl::StatusOr<IterationResult> result = (*runtime)->RunIteration(0);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(),
                                "stage 0 (replica 0's stage 0), iteration 0, 'backward [0, 6) "
                                "mb 1': an illegal memory access; also failed: "))
      << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "replica 1 is gone")) << result.status();
}

}  // namespace
}  // namespace pipetrain
