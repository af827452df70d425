#include "common/data_plane_keys.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secrets.h"

namespace pipetrain {

std::string DataPlaneJobId(absl::string_view job_id, int64_t plan_version) {
  return absl::StrCat(job_id, "/", plan_version);
}

std::string DataPlaneReceiveKey(absl::string_view plan_secret, absl::string_view data_plane_job,
                                int receiver) {
  return HmacSha256Hex(
      plan_secret, absl::StrCat("pipetrain-dataplane-v2-receive|", data_plane_job, "|", receiver));
}

std::string DataPlaneLinkKey(absl::string_view receive_key, absl::string_view data_plane_job,
                             int sender) {
  return HmacSha256Hex(receive_key,
                       absl::StrCat("pipetrain-dataplane-v2-link|", data_plane_job, "|", sender));
}

std::vector<DataPlaneKeys> DeriveDataPlaneKeys(absl::string_view plan_secret,
                                               absl::string_view data_plane_job, int num_workers) {
  PT_CHECK(num_workers >= 0 && !plan_secret.empty());
  std::vector<DataPlaneKeys> keys(num_workers);
  for (int b = 0; b < num_workers; ++b) {
    keys[b].receive_key = DataPlaneReceiveKey(plan_secret, data_plane_job, b);
  }
  for (int a = 0; a < num_workers; ++a) {
    keys[a].send_keys.reserve(num_workers);
    for (int b = 0; b < num_workers; ++b) {
      keys[a].send_keys.push_back(DataPlaneLinkKey(keys[b].receive_key, data_plane_job, a));
    }
  }
  return keys;
}

DataPlaneKeys DeriveWorkerDataPlaneKeys(absl::string_view plan_secret,
                                        absl::string_view data_plane_job, int worker,
                                        int num_workers) {
  PT_CHECK(worker >= 0 && worker < num_workers && !plan_secret.empty());
  DataPlaneKeys keys;
  keys.receive_key = DataPlaneReceiveKey(plan_secret, data_plane_job, worker);
  keys.send_keys.reserve(num_workers);
  for (int b = 0; b < num_workers; ++b) {
    keys.send_keys.push_back(DataPlaneLinkKey(DataPlaneReceiveKey(plan_secret, data_plane_job, b),
                                              data_plane_job, worker));
  }
  return keys;
}

}  // namespace pipetrain
