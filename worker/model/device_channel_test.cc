#include "worker/model/device_channel.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

DeviceGroupSpec Group(std::vector<int> stages, std::vector<std::pair<int, int>> links = {}) {
  return {"id", std::move(stages), std::move(links)};
}

TEST(DeviceGroupRankTest, Member_ItsIndex) {
  EXPECT_EQ(DeviceGroupRank(Group({0, 1}, {{0, 1}, {1, 0}}), 0).value(), 0);
  EXPECT_EQ(DeviceGroupRank(Group({1, 3, 4}, {{1, 3}, {4, 1}}), 3).value(), 1);
  EXPECT_EQ(DeviceGroupRank(Group({1, 3, 4}), 4).value(), 2);
}

TEST(DeviceGroupRankTest, BadGroups_InvalidArgumentSayingWhy) {
  const struct {
    std::vector<int> stages;
    int stage;
    const char* why;
    std::vector<std::pair<int, int>> links = {};
  } cases[] = {
      {{}, 0, "device group [] needs at least two stages"},
      {{2}, 2, "needs at least two stages"},
      {{1, 1}, 1, "distinct non-negative stages in ascending order"},
      {{3, 1}, 1, "distinct non-negative stages in ascending order"},
      {{-1, 0}, 0, "distinct non-negative stages in ascending order"},
      {{0, 2}, 1, "device group [0, 2] does not include stage 1"},
      {{0, 2}, 0, "link 0 -> 1 must join two different members", {{0, 1}}},
      {{0, 2}, 0, "link 2 -> 2 must join two different members", {{2, 2}}},
      {{0, 2}, 0, "link 0 -> 2 must join two different members and be listed once",
       {{0, 2}, {0, 2}}},
  };
  for (const auto& c : cases) {
    absl::StatusOr<int> rank = DeviceGroupRank(Group(c.stages, c.links), c.stage);
    ASSERT_FALSE(rank.ok()) << c.why;
    EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(rank.status().message(), c.why)) << rank.status();
  }
}

}  // namespace
}  // namespace pipetrain
