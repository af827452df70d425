#include "coordinator/jobs/memory_budget.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain {
namespace {

// What a worker's budget is, and the name of the memory it shares (empty:
// its own).
struct Budget {
  double bytes = 0;
  std::string shared;
};

Budget BudgetOf(const v1::Worker& w) {
  const v1::DeviceInfo& d = w.device();
  Budget b;
  if (!d.gpu_model().empty()) {
    b.bytes = static_cast<double>(d.gpu_memory_bytes());
    const std::string gpu =
        d.gpu_pci_bus_id().empty() ? absl::StrCat("#", d.gpu_index()) : d.gpu_pci_bus_id();
    if (!d.hostname().empty()) b.shared = absl::StrCat("GPU ", gpu, " of host ", d.hostname());
    return b;
  }
  const int64_t limit = d.memory_limit_bytes() > 0 ? d.memory_limit_bytes() : d.memory_bytes();
  b.bytes = static_cast<double>(limit);
  if (!d.hostname().empty() && limit >= d.memory_bytes()) {
    b.shared = absl::StrCat("host ", d.hostname(), "'s RAM");
  }
  return b;
}

}  // namespace

std::vector<double> PlanMemoryBudgets(const std::vector<v1::Worker>& workers, std::string* shared) {
  std::vector<Budget> budgets;
  std::map<std::string, int> sharers;
  for (const v1::Worker& w : workers) {
    budgets.push_back(BudgetOf(w));
    if (!budgets.back().shared.empty()) ++sharers[budgets.back().shared];
  }
  std::vector<double> out;
  for (const Budget& b : budgets) {
    out.push_back(b.shared.empty() ? b.bytes : b.bytes / sharers[b.shared]);
  }
  if (shared != nullptr) {
    std::vector<std::string> parts;
    for (const auto& [what, count] : sharers) {
      if (count > 1) parts.push_back(absl::StrCat(what, " shared by ", count, " workers"));
    }
    *shared = absl::StrJoin(parts, ", ");
  }
  return out;
}

}  // namespace pipetrain
