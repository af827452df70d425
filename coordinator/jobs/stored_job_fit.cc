#include "coordinator/jobs/stored_job_fit.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/store.h"

namespace pipetrain {

size_t MaxStoredJobBytes() { return kMaxValueBytes - kSealedRecordOverheadBytes; }

std::string FitStoredJob(size_t limit, store::StoredJob* stored) {
  const auto fits = [&] { return stored->ByteSizeLong() <= limit; };
  if (fits()) return "";
  const size_t before = stored->ByteSizeLong();
  std::vector<std::string> shed;
  v1::JobProgress* progress = stored->mutable_job()->mutable_progress();
  int64_t losses = 0;
  while (!fits() && progress->loss_history_size() > 0) {
    // Halving: a few passes, each ByteSizeLong linear in the record.
    const int drop = (progress->loss_history_size() + 1) / 2;
    auto* history = progress->mutable_loss_history();
    history->erase(history->begin(), history->begin() + drop);
    progress->set_loss_history_start(progress->loss_history_start() + drop);
    losses += drop;
  }
  if (losses > 0) shed.push_back(absl::StrCat("the oldest ", losses, " losses"));
  auto* plans = stored->mutable_job()->mutable_plan_history();
  int versions = 0;
  while (!fits() && plans->size() > 1) {
    plans->erase(plans->begin());
    ++versions;
  }
  if (versions > 0) shed.push_back(absl::StrCat("the oldest ", versions, " plan versions"));
  if (!fits() && progress->stage_times_size() > 0) {
    shed.push_back(absl::StrCat("the ", progress->stage_times_size(), " stage times"));
    progress->clear_stage_times();
  }
  if (!fits()) {
    return absl::StrCat(shed.empty() ? "nothing could be left out"
                                     : absl::StrCat("left out ", absl::StrJoin(shed, ", ")),
                        ", and its record of ", before, " bytes is still ", stored->ByteSizeLong(),
                        ", over ", limit, ": its saves fail");
  }
  return absl::StrCat("left out ", absl::StrJoin(shed, ", "), " to keep its record of ", before,
                      " bytes within ", limit, " (now ", stored->ByteSizeLong(), ")");
}

}  // namespace pipetrain
