#include "common/closest_name.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"

namespace pipetrain {
namespace {

constexpr size_t kMaxCompared = 64;

// Lowercase, without '_' and '-', cut to kMaxCompared bytes.
std::string Folded(absl::string_view name) {
  std::string out;
  for (char c : name.substr(0, kMaxCompared)) {
    if (c != '_' && c != '-') out.push_back(absl::ascii_tolower(c));
  }
  return out;
}

}  // namespace

int NameDistance(absl::string_view a, absl::string_view b) {
  const std::string x = Folded(a), y = Folded(b);
  // One row of the Levenshtein table at a time.
  std::vector<int> row(y.size() + 1);
  for (size_t j = 0; j <= y.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= x.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= y.size(); ++j) {
      const int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (x[i - 1] == y[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[y.size()];
}

std::string ClosestName(absl::string_view typed, const std::vector<std::string>& names) {
  const size_t length = Folded(typed).size();
  const int allowed = length <= 4 ? 1 : length <= 8 ? 2 : 3;
  std::string best;
  int best_distance = allowed + 1;
  for (const std::string& name : names) {
    const int d = NameDistance(typed, name);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  }
  return best;
}

}  // namespace pipetrain
