// current_instruction() says what a stage waits for inside an instruction:
// replica 0 of two, whose partner never sends, shows the optimizer step's
// all-reduce over the replicas while it waits there (an operator reading
// `pipetrain workers` must not take it for the optimizer computing), and
// the optimizer step again once the wait ended.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/model/gpt_config.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"

namespace pipetrain {
namespace {

// Takes every send; a receive waits until released, then fails.
class SilentPartner : public Transport {
 public:
  int stage() const override { return 0; }
  absl::Status SendWire(int, const TensorAddress&, const WireTensor&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress&, absl::Duration timeout) override {
    released_.WaitForNotificationWithTimeout(timeout);
    return absl::AbortedError("the partner replica is gone");
  }
  void Release() { released_.Notify(); }

 private:
  absl::Notification released_;
};

TEST(StageRuntimeActivityTest, WaitingForTheReplicas_ShowsTheAllReduce) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const int units = NumUnits(c.model);
  absl::StatusOr<std::vector<v1::Program>> programs =
      CompilePrograms({{0, units}}, units, c.micro_batches / 2, Schedule::kOneFOneB);
  ASSERT_TRUE(programs.ok()) << programs.status();
  v1::UnitRange all;
  all.set_begin(0);
  all.set_end(units);
  // The step's micro-batches are shared by the replicas: this one's program
  // runs half of them.
  StageSetup setup{"job-dp", c, 0, 1, all, all, (*programs)[0], absl::Seconds(60)};
  setup.replica = 0;
  setup.replicas = 2;
  SilentPartner transport;
  absl::StatusOr<std::unique_ptr<StageRuntime>> runtime =
      StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  absl::Status ended;
  std::atomic<bool> done{false};
  std::thread stage([&] {
    ended = (*runtime)->RunIteration(0).status();
    done.store(true);
  });
  std::string shown;
  // Polls an observable state; bounded by the receive's 60 s.
  while (!done.load() && !absl::StrContains(shown, "all-reduce")) {
    shown = (*runtime)->current_instruction();
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_TRUE(absl::StartsWith(shown, "optimizer step")) << shown;
  EXPECT_TRUE(absl::EndsWith(shown, ": all-reduce of the gradients over 2 replicas")) << shown;
  transport.Release();
  stage.join();
  EXPECT_EQ(ended.code(), absl::StatusCode::kAborted) << ended;
  // The iteration failed: between steps, as after any iteration (the
  // failed instruction is not shown through the error's report).
  EXPECT_EQ((*runtime)->current_instruction(), kBetweenSteps);
}

}  // namespace
}  // namespace pipetrain
