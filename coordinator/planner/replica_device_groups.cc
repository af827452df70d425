#include "coordinator/planner/replica_device_groups.h"

#include <algorithm>

#include "common/logging.h"

namespace pipetrain {

ReplicaDeviceGroupPlan PlanReplicaDeviceGroups(const std::vector<DeviceLinkMember>& members,
                                               int replicas, int stages, int tensor,
                                               const std::vector<int>& compressed_stages,
                                               const std::vector<bool>& id_taken) {
  PT_CHECK(replicas >= 1 && stages >= 1 && tensor >= 1 &&
           members.size() == static_cast<size_t>(replicas) * stages * tensor &&
           (id_taken.empty() || id_taken.size() == members.size()))
      << members.size() << " members for " << replicas << " x " << stages << " x " << tensor << ", "
      << id_taken.size() << " id marks";
  ReplicaDeviceGroupPlan plan;
  plan.group_of_worker.assign(members.size(), -1);
  if (replicas < 2) return plan;
  for (int s = 0; s < stages; ++s) {
    const bool exact =
        std::find(compressed_stages.begin(), compressed_stages.end(), s) == compressed_stages.end();
    if (!exact) continue;
    // Each position's group, if it can have one; the stage's positions get
    // theirs only all together (below).
    std::vector<ReplicaDeviceGroupPlan::Group> stage_groups;
    std::vector<std::vector<int>> stage_workers;
    for (int t = 0; t < tensor; ++t) {
      std::vector<int> workers;  // replica r's at this position
      for (int r = 0; r < replicas; ++r) workers.push_back((r * stages + s) * tensor + t);
      bool joinable = true;
      for (size_t i = 0; i < workers.size() && joinable; ++i) {
        const DeviceLinkMember& m = members[workers[i]];
        joinable =
            !m.host.empty() && !m.nccl_unique_id.empty() && m.host == members[workers[0]].host;
        for (size_t j = 0; j < i && joinable; ++j) {
          joinable = !SameGpu(members[workers[j]], m);
        }
      }
      if (!joinable) break;
      auto free_id = [&](int w) { return id_taken.empty() || !id_taken[w]; };
      const auto owner = std::find_if(workers.begin(), workers.end(), free_id);
      if (owner == workers.end()) break;  // every member's id serves a device group
      ReplicaDeviceGroupPlan::Group group;
      group.stage = s;
      group.tensor_rank = t;
      group.id_owner = *owner;
      group.group.set_nccl_unique_id(members[*owner].nccl_unique_id);
      for (int r = 0; r < replicas; ++r) group.group.add_replicas(r);
      stage_groups.push_back(std::move(group));
      stage_workers.push_back(std::move(workers));
    }
    // A stage's tensor ranks sum the tensors they all hold whole (its
    // LayerNorms, biases, wpe) in their own flat sums: on NCCL on some
    // ranks and the gRPC ring on others, the order of the replicas' terms
    // would differ (3 replicas or more), and the ranks' copies drift apart.
    if (static_cast<int>(stage_groups.size()) != tensor) continue;
    for (int t = 0; t < tensor; ++t) {
      for (int w : stage_workers[t]) plan.group_of_worker[w] = static_cast<int>(plan.groups.size());
      plan.groups.push_back(std::move(stage_groups[t]));
    }
  }
  return plan;
}

}  // namespace pipetrain
