// A device backend's error (backend.h: the first one sticks, status()
// returns it) fails the instruction that hit it, naming the stage, the
// iteration and the instruction, and the iteration's background sends are
// drained first. The CPU backend cannot fail, so a stand-in reports an
// error once the stage has run a given number of GELU forward passes (one
// per MLP unit and micro-batch).
#include <atomic>
#include <memory>

#include "absl/strings/match.h"
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

}  // namespace
}  // namespace pipetrain
