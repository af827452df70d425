#include "coordinator/planner/schedule_compiler.h"

#include <set>
#include <tuple>

#include "common/program_text.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<std::string> Describe(const v1::Program& p) {
  std::vector<std::string> out;
  for (const auto& in : p.instructions()) out.push_back(DescribeInstruction(in));
  return out;
}

TEST(ScheduleCompilerTest, OneFOneB_TwoStagesThreeMicroBatches_ExactPrograms) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value();
  ASSERT_EQ(programs.size(), 2u);
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{
                "forward [0, 2) mb 0", "send ACTIVATION unit 1 mb 0 to stage 1",
                "forward [0, 2) mb 1", "send ACTIVATION unit 1 mb 1 to stage 1",
                "recv ACTIVATION_GRAD unit 2 mb 0 from stage 1", "backward [0, 2) mb 0",
                "forward [0, 2) mb 2", "send ACTIVATION unit 1 mb 2 to stage 1",
                "recv ACTIVATION_GRAD unit 2 mb 1 from stage 1", "backward [0, 2) mb 1",
                "recv ACTIVATION_GRAD unit 2 mb 2 from stage 1", "backward [0, 2) mb 2",
                "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 1",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 1", "add tied gradient",
                "optimizer step [0, 2)"}));
  EXPECT_EQ(Describe(programs[1]),
            (std::vector<std::string>{
                "recv ACTIVATION unit 1 mb 0 from stage 0", "forward [2, 4) mb 0",
                "backward [2, 4) mb 0", "send ACTIVATION_GRAD unit 2 mb 0 to stage 0",
                "recv ACTIVATION unit 1 mb 1 from stage 0", "forward [2, 4) mb 1",
                "backward [2, 4) mb 1", "send ACTIVATION_GRAD unit 2 mb 1 to stage 0",
                "recv ACTIVATION unit 1 mb 2 from stage 0", "forward [2, 4) mb 2",
                "backward [2, 4) mb 2", "send ACTIVATION_GRAD unit 2 mb 2 to stage 0",
                "send TIED_EMBEDDING_GRAD unit 0 mb -1 to stage 0",
                "recv TIED_EMBEDDING_GRAD unit 0 mb -1 from stage 0", "add tied gradient",
                "optimizer step [2, 4)"}));
}

TEST(ScheduleCompilerTest, SingleStage_SumsTiedGradientLocally) {
  auto programs = CompilePrograms({{0, 4}}, 4, 2, Schedule::kGPipe).value();
  EXPECT_EQ(Describe(programs[0]),
            (std::vector<std::string>{"forward [0, 4) mb 0", "forward [0, 4) mb 1",
                                      "backward [0, 4) mb 0", "backward [0, 4) mb 1",
                                      "add tied gradient", "optimizer step [0, 4)"}));
}

// Runs all stage programs together with buffered sends and blocking
// receives, round-robin, and reports the peak number of micro-batches whose
// forward ran but whose backward did not, per stage.
struct SimulationResult {
  bool finished = false;
  std::vector<int> peak_in_flight;
  int unmatched_sends = 0;
};

SimulationResult Simulate(const std::vector<v1::Program>& programs) {
  const int stages = static_cast<int>(programs.size());
  using Msg = std::tuple<int, int, int, int, int>;  // from, to, kind, mb, unit
  std::multiset<Msg> wire;
  std::vector<int> pc(stages, 0), in_flight(stages, 0);
  SimulationResult result;
  result.peak_in_flight.assign(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (pc[s] < programs[s].instructions_size()) {
        const auto& in = programs[s].instructions(pc[s]);
        if (in.has_recv()) {
          const auto& k = in.recv().tensor();
          auto it = wire.find({in.recv().peer_stage(), s, k.kind(), k.micro_batch(), k.unit()});
          if (it == wire.end()) break;  // blocked
          wire.erase(it);
        } else if (in.has_send()) {
          const auto& k = in.send().tensor();
          wire.insert({s, in.send().peer_stage(), k.kind(), k.micro_batch(), k.unit()});
        } else if (in.has_forward()) {
          result.peak_in_flight[s] = std::max(result.peak_in_flight[s], ++in_flight[s]);
        } else if (in.has_backward()) {
          --in_flight[s];
        }
        ++pc[s];
        progress = true;
      }
    }
  }
  result.finished = true;
  for (int s = 0; s < stages; ++s) {
    result.finished = result.finished && pc[s] == programs[s].instructions_size();
  }
  result.unmatched_sends = static_cast<int>(wire.size());
  return result;
}

TEST(ScheduleCompilerTest, AllShapes_DeadlockFreeMatchedAndBounded) {
  for (Schedule schedule : {Schedule::kOneFOneB, Schedule::kGPipe}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int m = 1; m <= 8; ++m) {
        std::vector<Range> ranges;
        for (int s = 0; s < stages; ++s) ranges.push_back({s, s + 1});
        auto programs = CompilePrograms(ranges, stages, m, schedule).value();
        SimulationResult r = Simulate(programs);
        SCOPED_TRACE(ScheduleName(schedule) + " P=" + std::to_string(stages) +
                     " m=" + std::to_string(m));
        EXPECT_TRUE(r.finished);
        EXPECT_EQ(r.unmatched_sends, 0);
        for (int s = 0; s < stages; ++s) {
          const int bound = schedule == Schedule::kGPipe ? m : std::min(m, stages - s);
          EXPECT_EQ(r.peak_in_flight[s], bound) << "stage " << s;
        }
      }
    }
  }
}

TEST(ScheduleCompilerTest, BadRanges_AreInvalidArgument) {
  EXPECT_EQ(CompilePrograms({{0, 2}, {3, 4}}, 4, 1, Schedule::kGPipe).status().message(),
            "stage 1 covers [3, 4); stages must be non-empty and contiguous from unit 0");
  EXPECT_EQ(CompilePrograms({{0, 2}}, 4, 1, Schedule::kGPipe).status().message(),
            "stages cover 2 of 4 units");
  EXPECT_EQ(CompilePrograms({{0, 4}}, 4, 0, Schedule::kGPipe).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSchedule("zb").status().message(),
            "unknown schedule 'zb'; use 1f1b or gpipe");
}

}  // namespace
}  // namespace pipetrain
