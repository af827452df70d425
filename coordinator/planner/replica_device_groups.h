// Replica device groups: which stages of a data-parallel job sum their
// gradients with NCCL between the GPUs of one host (plan.proto
// ReplicaDeviceGroup; worker/model/device_collective.h) instead of the gRPC
// collectives (issue 21, scope 1: "NCCL for GPUs of one device group").
//
// A job's workers are placed as the job manager places them: worker
// g = (r * stages + s) * tensor + t is replica r's stage s at tensor rank t.
// A position (s, t) gets a group when
//  - stage s all-reduces exactly (it is not in `compressed_stages`: the
//    PowerSGD and quantized all-reduces run on the host);
//  - every one of its `replicas` members is eligible (a non-empty host and
//    nccl_unique_id: DeviceLinkMember's), all on one host;
//  - no two members may be on the same GPU (SameGpu, as device links
//    decide it: NCCL refuses two ranks on one GPU).
// Otherwise the whole position stays on the gRPC collectives: a group of
// some replicas only would need a two-level all-reduce (NCCL inside the
// host, gRPC between hosts), which is not built. And a stage's tensor
// ranks get groups all or none: each rank sums the tensors they all hold
// whole, and NCCL on one rank beside the gRPC ring on another would add
// the replicas' terms in other orders, so those copies would drift apart. The group lists replicas
// 0 .. replicas - 1 and carries the id of its lowest replica whose
// worker's id is not in `id_taken` (per worker; empty: none taken, e.g.
// by device groups: device_links.h), the id owner; a position whose every
// member's id is taken stays on the gRPC collectives. The owner's id is
// used up (the caller must not hand it to another group; the worker
// reports a fresh one, coordinator.proto HeartbeatRequest). Each worker
// holds one position, so no id serves two replica groups.
//
// Pure and thread-compatible. Requires members.size() == replicas * stages
// * tensor, all three >= 1, and id_taken empty or of members' size
// (checked: aborts otherwise; the job manager places the workers so).
#ifndef PIPETRAIN_COORDINATOR_PLANNER_REPLICA_DEVICE_GROUPS_H_
#define PIPETRAIN_COORDINATOR_PLANNER_REPLICA_DEVICE_GROUPS_H_

#include <vector>

#include "coordinator/planner/device_links.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

struct ReplicaDeviceGroupPlan {
  struct Group {
    v1::ReplicaDeviceGroup group;
    int stage = 0;        // the position's stage
    int tensor_rank = 0;  // and tensor rank
    int id_owner = -1;    // the worker (index into members) whose id it carries
  };
  std::vector<Group> groups;         // by position, (s, t) ascending
  std::vector<int> group_of_worker;  // per worker: index into groups, or -1
};

ReplicaDeviceGroupPlan PlanReplicaDeviceGroups(const std::vector<DeviceLinkMember>& members,
                                               int replicas, int stages, int tensor,
                                               const std::vector<int>& compressed_stages,
                                               const std::vector<bool>& id_taken = {});

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_REPLICA_DEVICE_GROUPS_H_
