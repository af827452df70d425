// StageRuntime::Create's checks of the program it is given (the
// coordinator's, so untrusted): a Forward, Recompute or Backward whose
// micro-batch is not one of this replica's is INVALID_ARGUMENT naming the
// instruction, instead of a CHECK failure in the dataset (a negative or
// too large one) or training on another replica's samples.
#include <string>
#include <vector>

#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

constexpr int kUnits = 6;  // SmallConfig's 2 layers: embed, 4 blocks, head

// `program` with the first instruction of kind `op` (a Recompute is added
// when it has none) set to micro-batch `mb`.
v1::Program WithMicroBatch(v1::Program program, v1::Instruction::OpCase op, int mb) {
  for (v1::Instruction& in : *program.mutable_instructions()) {
    if (in.op_case() != op) continue;
    if (op == v1::Instruction::kForward) in.mutable_forward()->set_micro_batch(mb);
    if (op == v1::Instruction::kBackward) in.mutable_backward()->set_micro_batch(mb);
    return program;
  }
  v1::Instruction::Recompute* r = program.add_instructions()->mutable_recompute();
  r->mutable_units()->set_begin(0);
  r->mutable_units()->set_end(kUnits);
  r->set_micro_batch(mb);
  return program;
}

// Replica 0 of 2 of a one-stage job: SmallConfig's 4 micro-batches per
// step, so this replica's are 0 and 1 (replica 1 trains 2 and 3).
TEST(StageRuntimeCreate, TrainingMicroBatchNotThisReplicas_InvalidArgumentNamingIt) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, kUnits}};
  const v1::Program program =
      CompilePrograms(ranges, kUnits, /*micro_batches=*/2, Schedule::kOneFOneB).value()[0];
  InProcessFabric fabric(2);
  std::unique_ptr<Transport> transport = fabric.Connect(0);
  StageSetup setup{
      "job-m", c, 0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]), program, absl::Seconds(30)};
  setup.replicas = 2;
  ASSERT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok());
  const std::vector<std::pair<v1::Instruction::OpCase, std::string>> ops = {
      {v1::Instruction::kForward, "forward [0, 6)"},
      {v1::Instruction::kBackward, "backward [0, 6)"},
      {v1::Instruction::kRecompute, "recompute [0, 6)"}};
  for (const auto& [op, text] : ops) {
    for (int mb : {-1, 2, 3, 1 << 30}) {  // 2 and 3 are replica 1's
      setup.program = WithMicroBatch(program, op, mb);
      absl::Status created = StageRuntime::Create(setup, &data, transport.get()).status();
      EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << text << " mb " << mb;
      EXPECT_NE(created.message().find(absl::StrCat("stage 0: \"", text, " mb ", mb,
                                                    "\" reads training micro-batch ", mb,
                                                    "; this replica's are 0 .. 1")),
                std::string::npos)
          << created;
    }
    setup.program = WithMicroBatch(program, op, 1);
    EXPECT_TRUE(StageRuntime::Create(setup, &data, transport.get()).ok()) << text;
  }
}

// Validation micro-batches are the planner's ceil(eval_windows / rows per
// micro-batch): SmallConfig's 7 windows in micro-batches of 2 rows make 4.
TEST(StageRuntimeCreate, ValidationMicroBatchOutOfRange_InvalidArgumentNamingIt) {
  const TrainConfig c = testing::SmallConfig();
  const Dataset data = testing::MakeDataset();
  const std::vector<Range> ranges = {{0, kUnits}};
  const v1::Program program =
      CompilePrograms(ranges, kUnits, c.micro_batches, Schedule::kOneFOneB).value()[0];
  const v1::Program eval = CompileEvalPrograms(ranges, kUnits, 4).value()[0];
  StageSetup setup{
      "job-m",           c,   0, 1, ToUnitRange(ranges[0]), ToUnitRange(ranges[0]), program,
      absl::Seconds(30), eval};
  ASSERT_TRUE(StageRuntime::Create(setup, &data, nullptr).ok());
  for (int mb : {-1, 4}) {
    setup.eval_program = WithMicroBatch(eval, v1::Instruction::kForward, mb);
    absl::Status created = StageRuntime::Create(setup, &data, nullptr).status();
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << mb;
    EXPECT_NE(created.message().find(absl::StrCat("stage 0: \"validation forward [0, 6) mb ", mb,
                                                  "\" reads validation micro-batch ", mb,
                                                  "; there are 0 .. 3")),
              std::string::npos)
        << created;
  }
}

}  // namespace
}  // namespace pipetrain
