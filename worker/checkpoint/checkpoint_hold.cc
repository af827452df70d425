#include "worker/checkpoint/checkpoint_hold.h"

#include <fcntl.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pipetrain {

absl::StatusOr<CheckpointHold> ParseCheckpointHold(const std::string& flag,
                                                   const std::string& value) {
  CheckpointHold hold;
  if (value.empty()) return hold;
  // The marker is the rest: a path may hold ':'.
  const std::vector<std::string> parts = absl::StrSplit(value, absl::MaxSplits(':', 2));
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &hold.step) || hold.step < 1 ||
      !absl::SimpleAtoi(parts[1], &hold.unit) || hold.unit < 0 || parts[2].empty() ||
      parts[2][0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": \"", value,
                     "\" is not STEP:UNIT:MARKER (a step >= 1, a unit >= 0, an absolute path)"));
  }
  hold.marker = parts[2];
  return hold;
}

bool ClaimCheckpointHold(const CheckpointHold& hold, const StageSnapshot& snapshot) {
  if (hold.step == 0 || snapshot.step != hold.step) return false;
  std::vector<int> units;
  bool holds_unit = false;
  for (const UnitState& unit : snapshot.units) {
    units.push_back(unit.unit);
    holds_unit = holds_unit || unit.unit == hold.unit;
  }
  if (!holds_unit) return false;
  // Written under a name of this process's, then linked to the marker's,
  // which fails if it exists: the marker appears whole, and only once.
  const std::string draft = absl::StrCat(hold.marker, ".", getpid());
  const int fd = open(draft.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const std::string text = absl::StrCat(getpid(), "\n", absl::StrJoin(units, " "), "\n");
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  const bool claimed = written && link(draft.c_str(), hold.marker.c_str()) == 0;
  unlink(draft.c_str());
  return claimed;
}

}  // namespace pipetrain
