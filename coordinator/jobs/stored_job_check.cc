#include "coordinator/jobs/stored_job_check.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "spec/job_spec.h"

namespace pipetrain {

namespace {

bool InCount(int64_t value) { return value >= 0 && value <= kMaxStoredCount; }

// 9999-12-31T23:59:59Z: google.protobuf.Timestamp's last second.
constexpr int64_t kMaxTimestampSeconds = 253402300799;

// The last second a stored time may hold at `now` (StoredTimeFits).
int64_t LatestStoredSecond(absl::Time now) {
  return std::min(absl::ToUnixSeconds(now + kMaxStoredTimeAhead), kMaxTimestampSeconds);
}

}  // namespace

std::string StoredFieldOfANewerBuild(const v1::JobSpec& spec, const std::string& profile_json) {
  if (const std::optional<UnknownField> field = FirstUnknownField(spec, "spec")) {
    return DescribeUnknownField(*field);
  }
  if (const std::string key = FirstUnknownProfileKey(profile_json); !key.empty()) {
    return absl::StrCat("profile_json has key ", key);
  }
  return "";
}

std::string StoredPlanMismatch(const v1::Plan& plan, std::optional<int> units) {
  if (!InCount(plan.version())) return absl::StrCat("plan version ", plan.version());
  if (plan.data_parallel() < 0 || plan.data_parallel() > kMaxStages) {
    return absl::StrCat("data_parallel ", plan.data_parallel(), " outside [0, ", kMaxStages, "]");
  }
  if (plan.tensor_parallel() < 0 || plan.tensor_parallel() > kMaxTensorParallel) {
    return absl::StrCat("tensor_parallel ", plan.tensor_parallel(), " outside [0, ",
                        kMaxTensorParallel, "]");
  }
  // At most 1024 x 64: no overflow.
  const int per_stage = std::max(1, plan.data_parallel()) * std::max(1, plan.tensor_parallel());
  if (plan.stages_size() % per_stage != 0) {
    return absl::StrCat(plan.stages_size(), " stage entries for ", per_stage,
                        " replicas x tensor ranks");
  }
  if (!units.has_value()) return "";
  for (int st = 0; st < plan.stages_size(); ++st) {
    for (const v1::UnitRange* range : {&plan.stages(st).forward(), &plan.stages(st).backward()}) {
      if (range->begin() < 0 || range->end() < range->begin() || range->end() > *units) {
        return absl::StrCat("stage ", st, " has units [", range->begin(), ", ", range->end(),
                            ") of a model of ", *units);
      }
    }
  }
  return "";
}

std::string StoredProfileMismatch(const ModelProfile& profile, const GptConfig& model) {
  const int units = NumUnits(model);
  if (static_cast<int64_t>(profile.units.size()) != units) {
    return absl::StrCat("the profile has ", profile.units.size(), " units, the model ", units);
  }
  for (int u = 0; u < units; ++u) {
    const std::string name = UnitName(model, u);
    if (profile.units[u].name != name) {
      return absl::StrCat("the profile's unit ", u, " is \"",
                          absl::CHexEscape(profile.units[u].name.substr(0, 64)),
                          "\", the model's \"", name, "\"");
    }
  }
  return "";
}

std::string StoredCountersMismatch(const v1::Job& job,
                                   const std::vector<v1::ResumeFrom>& checkpoints,
                                   const v1::ResumeFrom* init_checkpoint,
                                   int32_t recoveries_without_progress) {
  const v1::JobProgress& p = job.progress();
  const std::pair<const char*, int64_t> counts[] = {
      {"plan_version", job.plan_version()},
      {"progress.step", p.step()},
      {"progress.val_step", p.val_step()},
      {"progress.loss_history_start", p.loss_history_start()},
      {"progress.checkpoint_step", p.checkpoint_step()},
      {"progress.steps_redone", p.steps_redone()},
      {"progress.checkpoint_failures", p.checkpoint_failures()},
  };
  for (const auto& [name, value] : counts) {
    if (!InCount(value)) {
      return absl::StrCat(name, " ", value, " outside [0, ", kMaxStoredCount, "]");
    }
  }
  const std::pair<const char*, int32_t> recoveries[] = {
      {"progress.recoveries", p.recoveries()},
      {"recoveries_without_progress", recoveries_without_progress},
  };
  for (const auto& [name, value] : recoveries) {
    if (value < 0 || value > kMaxStoredRecoveries) {
      return absl::StrCat(name, " ", value, " outside [0, ", kMaxStoredRecoveries, "]");
    }
  }
  if (init_checkpoint != nullptr && !InCount(init_checkpoint->step())) {
    return absl::StrCat("init_checkpoint step ", init_checkpoint->step(), " outside [0, ",
                        kMaxStoredCount, "]");
  }
  for (const v1::ResumeFrom& checkpoint : checkpoints) {
    if (!InCount(checkpoint.step())) {
      return absl::StrCat("checkpoint step ", checkpoint.step(), " outside [0, ", kMaxStoredCount,
                          "]");
    }
  }
  return "";
}

bool StoredTimeFits(const google::protobuf::Timestamp& time, absl::Time now) {
  return time.nanos() >= 0 && time.nanos() < 1000000000 && time.seconds() >= 0 &&
         time.seconds() <= LatestStoredSecond(now);
}

std::string StoredTimesMismatch(const v1::Job& job, absl::Time now) {
  const std::string latest = absl::FormatTime(
      "%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(LatestStoredSecond(now)), absl::UTCTimeZone());
  const auto mismatch = [&](const std::string& name, const google::protobuf::Timestamp& time) {
    if (StoredTimeFits(time, now)) return std::string();
    return absl::StrCat(name, " (seconds ", time.seconds(), ", nanos ", time.nanos(),
                        ") outside [1970-01-01T00:00:00Z, ", latest, "]");
  };
  std::string found = mismatch("create_time", job.create_time());
  if (found.empty()) found = mismatch("update_time", job.update_time());
  for (int i = 0; found.empty() && i < job.plan_history_size(); ++i) {
    found = mismatch(absl::StrCat("plan_history[", i, "].time"), job.plan_history(i).time());
  }
  return found;
}

}  // namespace pipetrain
