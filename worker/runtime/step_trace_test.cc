// RunIteration(iteration, trace) on a real pipeline: 3 stages x 2
// data-parallel replicas, 1F1B, in one process. Every runtime's trace has
// one timing per instruction of its program, in order, passes the
// coordinator's bounds (CheckStepTrace) and draws (MeasuredTimeline); and
// tracing a step changes nothing of the training.
#include <algorithm>

#include "absl/time/clock.h"
#include "coordinator/planner/measured_timeline.h"
#include "coordinator/planner/partition.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"

namespace pipetrain {
namespace {

using testing::MakeDataset;
using testing::PipelineExtras;
using testing::RunOutput;
using testing::RunPipeline;
using testing::SmallConfig;

TEST(StepTraceTest, OneTimingPerInstructionWithinBoundsAndTrainingUnchanged) {
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  auto ranges = UniformPartition(NumUnits(c.model), 3);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  PipelineExtras extras;
  extras.replicas = 2;
  const absl::Time before = absl::Now();
  const RunOutput plain =
      RunPipeline(c, data, *ranges, *ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  extras.traced_iteration = 3;
  const RunOutput traced =
      RunPipeline(c, data, *ranges, *ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  EXPECT_EQ(traced.losses, plain.losses);
  EXPECT_EQ(traced.weights, plain.weights);
  EXPECT_TRUE(plain.traces.empty());

  ASSERT_EQ(traced.traces.size(), 6u);
  ASSERT_EQ(traced.programs.size(), 6u);
  std::vector<const v1::Program*> programs;
  std::vector<const v1::StepTrace*> traces;
  int waits_for_the_all_reduce = 0;
  for (size_t g = 0; g < traced.traces.size(); ++g) {
    const v1::StepTrace& trace = traced.traces[g];
    const v1::Program& program = traced.programs[g];
    SCOPED_TRACE(::testing::Message() << "runtime " << g);
    EXPECT_EQ(trace.iteration(), 3);
    ASSERT_EQ(trace.instructions_size(), program.instructions_size());
    for (int i = 0; i < trace.instructions_size(); ++i) {
      EXPECT_EQ(trace.instructions(i).instruction(), i);
      if (i > 0) {  // one after the other on the runtime's thread
        EXPECT_GE(trace.instructions(i).start_seconds(), trace.instructions(i - 1).end_seconds());
      }
      const v1::Instruction& in = program.instructions(i);
      if (!in.has_recv() && !in.has_optimizer_step()) {
        EXPECT_EQ(trace.instructions(i).waited_seconds(), 0) << "instruction " << i;
      }
      if (in.has_optimizer_step() && trace.instructions(i).waited_seconds() > 0) {
        ++waits_for_the_all_reduce;
      }
    }
    const absl::Time start = absl::FromUnixSeconds(trace.start_time().seconds()) +
                             absl::Nanoseconds(trace.start_time().nanos());
    EXPECT_GE(start, before);
    EXPECT_LE(start, absl::Now());
    EXPECT_TRUE(CheckStepTrace(trace, 3, program).ok()) << CheckStepTrace(trace, 3, program);
    programs.push_back(&program);
    traces.push_back(&trace);
  }
  // With replicas the optimizer steps wait for the gradient all-reduce.
  EXPECT_GT(waits_for_the_all_reduce, 0);
  absl::StatusOr<SimulationResult> timeline = MeasuredTimeline(programs, traces);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  int passes = 0, drawn = 0;
  for (const v1::Program* p : programs) {
    for (const v1::Instruction& in : p->instructions())
      passes += in.has_forward() + in.has_backward();
  }
  for (const TimelineEvent& e : timeline->events) {
    drawn += e.kind == TimelineEventKind::kForward || e.kind == TimelineEventKind::kBackward;
  }
  EXPECT_EQ(drawn, passes);
  EXPECT_GT(timeline->iteration_seconds, 0);
}

}  // namespace
}  // namespace pipetrain
