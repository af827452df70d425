// Device links: which of a job's compiled sends and receives may travel over
// NCCL between GPUs of one host (LINK_PATH_DEVICE) instead of the data plane
// (LINK_PATH_WIRE), and the DeviceGroups (NCCL communicators) that carry
// them (DESIGN.md §6; docs/architecture.md, "The plan for NCCL in the data
// plane"). Runs after compression_marking.h, on the training programs only:
// evaluation programs stay on the wire.
//
// Rules:
//  - Eligible stage: its member has a non-empty host and nccl_unique_id.
//  - Candidate group: the eligible stages of one host, one per GPU. When
//    two eligible stages of a host may be on the same GPU (SameGpu: equal
//    PCI addresses; equal ordinals when either reports no address), the
//    lower stage keeps the GPU and the higher one stays out (NCCL refuses
//    two ranks on one GPU). Several hosts give several groups.
//  - Link a -> b (a, b in one candidate group): a's Sends to b of kind
//    ACTIVATION or ACTIVATION_GRAD with an empty codec (compressed sends
//    stay on the wire), in a's program order, and b's Recvs from a of those
//    tensor keys (kind, micro_batch, unit), in b's program order. When the
//    two key sequences are equal and non-empty, every one of those Sends
//    and Recvs gets LINK_PATH_DEVICE; otherwise the whole ordered pair stays
//    on the wire (NCCL matches in issue order, the wire by address).
//    TIED_EMBEDDING_GRAD, UNIT_WEIGHTS and EVAL_ACTIVATION always stay on
//    the wire.
//  - Formed group: the stages of a candidate group that have at least one
//    DEVICE instruction after the links are marked (Assignment.device_group
//    is absent for a stage without one, so a candidate member without a
//    device link is dropped; since each link has two ends, a formed group
//    has >= 2 stages). Its links list every ordered pair marked DEVICE, by
//    sender then receiver. Its stages ascend (rank r = stages[r]) and its
//    nccl_unique_id is that of its lowest stage, the id owner. The owner's
//    id is used up: the caller must not hand it to another group (the
//    worker reports a fresh one, coordinator.proto HeartbeatRequest).
//  - Every path in `programs` is recomputed (non-candidate stages and
//    stale marks are reset to WIRE), so the pass is idempotent.
//
// Pure and thread-compatible. Requires members.size() == programs->size()
// (checked: aborts otherwise). Peer stages out of range are left on the
// wire.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_DEVICE_LINKS_H_
#define PIPETRAIN_COORDINATOR_PLANNER_DEVICE_LINKS_H_

#include <string>
#include <utility>
#include <vector>

#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// What the planner knows about the worker of one stage (coordinator.proto
// DeviceInfo: hostname, gpu_index, gpu_pci_bus_id and the worker's current
// nccl_unique_id).
struct DeviceLinkMember {
  std::string host;
  int gpu_index = 0;
  std::string nccl_unique_id;  // empty: the worker cannot join NCCL groups
  // The GPU's PCI address (DeviceInfo.gpu_pci_bus_id); empty: unknown (an
  // older worker), gpu_index names the GPU. Workers isolated by
  // CUDA_VISIBLE_DEVICES all see ordinal 0, and one GPU may have different
  // ordinals in different processes: the address tells GPUs apart, as
  // NCCL does (MIG instances of one GPU share it, and NCCL refuses them
  // too).
  std::string gpu_pci_bus_id;
};

// Whether two members of one host may hold the same GPU: equal addresses
// when both report one; equal ordinals otherwise (a worker without an
// address, e.g. an older build beside a newer one, is compared the old way
// with everyone, so a GPU is never counted twice for lack of an address;
// different ordinals are trusted then, as before addresses).
bool SameGpu(const DeviceLinkMember& a, const DeviceLinkMember& b);

struct DeviceLinkGroup {
  v1::DeviceGroup group;    // stages ascending; the owner's id
  // The stage whose id it carries: group.stages(0) (but see
  // PlanReplicatedDeviceLinks).
  int id_owner_stage = -1;
};

struct DeviceLinkPlan {
  std::vector<DeviceLinkGroup> groups;  // formed groups, by lowest stage
  std::vector<int> group_of_stage;      // per stage: index into groups, or -1
  // Ordered pairs (a, b) of one candidate group whose device-eligible
  // sends a -> b stayed on the wire because the orders differ (for logs).
  std::vector<std::pair<int, int>> order_differs;
};

DeviceLinkPlan PlanDeviceLinks(const std::vector<DeviceLinkMember>& members,
                               std::vector<v1::Program>* programs);

// Device links of a data-parallel job: `replicas` pipelines of
// programs->size() stages share the programs (worker g = r * stages + s is
// replica r's stage s; members lists every worker so). Each replica's
// stages are planned as PlanDeviceLinks plans one pipeline, with its own
// workers; the marks go into the shared programs only when every replica
// marks them alike (otherwise every path stays on the wire, and
// replicas_differ says so). The returned groups then number members by
// worker (stages and links + r * stages; group_of_stage has one entry per
// worker), each replica's groups its own communicators with ids of their
// own. With replicas > 1, replica r's group takes its id from its member
// stages[r mod size] instead of its lowest (id_owner_stage says which),
// so that the replicas' groups draw their ids from different stage
// positions and each position keeps ids free for its replica device group
// (replica_device_groups.h). replicas == 1 is PlanDeviceLinks.
// Requires replicas >= 1 and members.size() == replicas * programs->size()
// (checked: aborts otherwise).
struct ReplicatedDeviceLinkPlan {
  DeviceLinkPlan links;
  bool replicas_differ = false;
};
ReplicatedDeviceLinkPlan PlanReplicatedDeviceLinks(const std::vector<DeviceLinkMember>& members,
                                                   int replicas,
                                                   std::vector<v1::Program>* programs);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_DEVICE_LINKS_H_
