#include "worker/model/device_channel.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain {

absl::StatusOr<int> DeviceGroupRank(const DeviceGroupSpec& group, int stage) {
  const std::vector<int>& stages = group.stages;
  const std::string named = absl::StrCat("device group [", absl::StrJoin(stages, ", "), "]");
  if (stages.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(named, " needs at least two stages"));
  }
  for (size_t r = 0; r < stages.size(); ++r) {
    if (stages[r] < 0 || (r > 0 && stages[r] <= stages[r - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, " must list distinct non-negative stages in ascending order"));
    }
  }
  auto member = [&](int s) { return std::binary_search(stages.begin(), stages.end(), s); };
  std::set<std::pair<int, int>> seen;
  for (const auto& [from, to] : group.links) {
    if (from == to || !member(from) || !member(to) || !seen.insert({from, to}).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, ": link ", from, " -> ", to,
          " must join two different members and be listed once"));
    }
  }
  auto it = std::find(stages.begin(), stages.end(), stage);
  if (it == stages.end()) {
    return absl::InvalidArgumentError(absl::StrCat(named, " does not include stage ", stage));
  }
  return static_cast<int>(it - stages.begin());
}

}  // namespace pipetrain
