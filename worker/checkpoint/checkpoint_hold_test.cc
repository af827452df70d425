#include "worker/checkpoint/checkpoint_hold.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

StageSnapshot SnapshotOf(int64_t step, std::vector<int> units) {
  StageSnapshot snapshot;
  snapshot.step = step;
  for (int u : units) {
    UnitState state;
    state.unit = u;
    snapshot.units.push_back(std::move(state));
  }
  return snapshot;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CheckpointHoldTest, Parse_EmptyIsNone_FormChecked) {
  EXPECT_EQ(ParseCheckpointHold("f", "").value().step, 0);
  const CheckpointHold hold = ParseCheckpointHold("f", "10:5:/tmp/a:b").value();
  EXPECT_EQ(hold.step, 10);
  EXPECT_EQ(hold.unit, 5);
  EXPECT_EQ(hold.marker, "/tmp/a:b");
  for (const char* bad :
       {"10", "10:5", "0:5:/m", "10:-1:/m", "x:5:/m", "10:y:/m", "10:5:", "10:5:relative"}) {
    const absl::Status status = ParseCheckpointHold("f", bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("--f: \""), std::string::npos) << status;
  }
}

// Only the step and unit named, and only once: the first claim creates the
// marker, whole, and every later one (another process's) finds it.
TEST(CheckpointHoldTest, Claim_OnlyThatStepAndUnit_Once) {
  const std::string marker = std::string(std::getenv("TEST_TMPDIR")) + "/held";
  unlink(marker.c_str());
  const CheckpointHold hold = ParseCheckpointHold("f", "10:5:" + marker).value();
  EXPECT_FALSE(ClaimCheckpointHold(CheckpointHold{}, SnapshotOf(10, {5})));
  EXPECT_FALSE(ClaimCheckpointHold(hold, SnapshotOf(5, {4, 5})));
  EXPECT_FALSE(ClaimCheckpointHold(hold, SnapshotOf(10, {3, 4})));
  struct stat st;
  EXPECT_NE(stat(marker.c_str(), &st), 0) << "created by a write it does not hold";
  EXPECT_TRUE(ClaimCheckpointHold(hold, SnapshotOf(10, {4, 5})));
  EXPECT_EQ(ReadAll(marker), std::to_string(getpid()) + "\n4 5\n");
  EXPECT_FALSE(ClaimCheckpointHold(hold, SnapshotOf(10, {5})));
  EXPECT_EQ(ReadAll(marker), std::to_string(getpid()) + "\n4 5\n");
  EXPECT_NE(stat((marker + "." + std::to_string(getpid())).c_str(), &st), 0) << "draft left";
}

}  // namespace
}  // namespace pipetrain
