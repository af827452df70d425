#include "coordinator/planner/replica_device_groups.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

DeviceLinkMember Gpu(const std::string& host, int index, const std::string& id = "id") {
  return {host, index, id.empty() ? "" : id + "@" + host + ":" + std::to_string(index),
          "0000:" + std::to_string(index) + ":00.0"};
}

// Two replicas of two stages on one host, four GPUs: each stage's replicas
// form a group carrying replica 0's id, listing replicas 0 and 1.
TEST(ReplicaDeviceGroupsTest, EveryExactPositionOnOneHostGetsAGroup) {
  // Worker g = r * stages + s: replica 0's stages 0, 1, then replica 1's.
  const std::vector<DeviceLinkMember> members = {Gpu("a", 0), Gpu("a", 1), Gpu("a", 2),
                                                 Gpu("a", 3)};
  const ReplicaDeviceGroupPlan plan = PlanReplicaDeviceGroups(members, 2, 2, 1, {});
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.group_of_worker, (std::vector<int>{0, 1, 0, 1}));
  for (int s = 0; s < 2; ++s) {
    const ReplicaDeviceGroupPlan::Group& g = plan.groups[s];
    EXPECT_EQ(g.stage, s);
    EXPECT_EQ(g.tensor_rank, 0);
    EXPECT_EQ(g.id_owner, s);  // replica 0's worker of the stage
    EXPECT_EQ(g.group.nccl_unique_id(), members[s].nccl_unique_id);
    EXPECT_EQ(std::vector<int>(g.group.replicas().begin(), g.group.replicas().end()),
              (std::vector<int>{0, 1}));
  }
}

// What keeps a position on the gRPC collectives: a compressed stage,
// replicas on two hosts, two replicas on one GPU, a member without an id
// or a host; one replica alone has no group at all.
TEST(ReplicaDeviceGroupsTest, PositionsThatCannotJoinStayOnGrpc) {
  const std::vector<DeviceLinkMember> one_host = {Gpu("a", 0), Gpu("a", 1), Gpu("a", 2),
                                                  Gpu("a", 3)};
  EXPECT_EQ(PlanReplicaDeviceGroups(one_host, 2, 2, 1, {1}).group_of_worker,
            (std::vector<int>{0, -1, 0, -1}));
  EXPECT_TRUE(PlanReplicaDeviceGroups(one_host, 1, 4, 1, {}).groups.empty());
  // Replica 1 on another host.
  EXPECT_TRUE(
      PlanReplicaDeviceGroups({Gpu("a", 0), Gpu("a", 1), Gpu("b", 0), Gpu("b", 1)}, 2, 2, 1, {})
          .groups.empty());
  // Stage 1's replicas on one GPU (same PCI address): stage 0 still groups.
  std::vector<DeviceLinkMember> shared = one_host;
  shared[3].gpu_pci_bus_id = shared[1].gpu_pci_bus_id;
  EXPECT_EQ(PlanReplicaDeviceGroups(shared, 2, 2, 1, {}).group_of_worker,
            (std::vector<int>{0, -1, 0, -1}));
  // Workers isolated by CUDA_VISIBLE_DEVICES: all ordinal 0, told apart by
  // address; without addresses, ordinal 0 twice is one GPU.
  std::vector<DeviceLinkMember> isolated = one_host;
  for (DeviceLinkMember& m : isolated) m.gpu_index = 0;
  EXPECT_EQ(PlanReplicaDeviceGroups(isolated, 2, 2, 1, {}).groups.size(), 2u);
  for (DeviceLinkMember& m : isolated) m.gpu_pci_bus_id.clear();
  EXPECT_TRUE(PlanReplicaDeviceGroups(isolated, 2, 2, 1, {}).groups.empty());
  std::vector<DeviceLinkMember> no_id = one_host;
  no_id[2].nccl_unique_id.clear();  // replica 1's stage 0
  EXPECT_EQ(PlanReplicaDeviceGroups(no_id, 2, 2, 1, {}).group_of_worker,
            (std::vector<int>{-1, 0, -1, 0}));
  std::vector<DeviceLinkMember> no_host = one_host;
  for (DeviceLinkMember& m : no_host) m.host.clear();
  EXPECT_TRUE(PlanReplicaDeviceGroups(no_host, 2, 2, 1, {}).groups.empty());
}

// Ids that device groups use (device_links.h): a position takes its
// lowest replica whose id is free, and stays on gRPC when none is.
TEST(ReplicaDeviceGroupsTest, IdsTakenByDeviceGroupsAreNotUsedAgain) {
  const std::vector<DeviceLinkMember> members = {Gpu("a", 0), Gpu("a", 1), Gpu("a", 2),
                                                 Gpu("a", 3)};
  // Workers 0 and 3 own the two replicas' device groups.
  const ReplicaDeviceGroupPlan plan =
      PlanReplicaDeviceGroups(members, 2, 2, 1, {}, {true, false, false, true});
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].id_owner, 2);  // stage 0: replica 1's
  EXPECT_EQ(plan.groups[0].group.nccl_unique_id(), members[2].nccl_unique_id);
  EXPECT_EQ(plan.groups[1].id_owner, 1);  // stage 1: replica 0's
  // Both of stage 0's ids taken: only stage 1 groups.
  EXPECT_EQ(
      PlanReplicaDeviceGroups(members, 2, 2, 1, {}, {true, false, true, false}).group_of_worker,
      (std::vector<int>{-1, 0, -1, 0}));
}

// Tensor ranks innermost: worker (r * stages + s) * tensor + t; each
// (stage, rank) position is a group of its own.
TEST(ReplicaDeviceGroupsTest, TensorRanksFormPositionsOfTheirOwn) {
  std::vector<DeviceLinkMember> members;
  for (int g = 0; g < 8; ++g) members.push_back(Gpu("a", g));
  const ReplicaDeviceGroupPlan plan = PlanReplicaDeviceGroups(members, 2, 2, 2, {});
  ASSERT_EQ(plan.groups.size(), 4u);
  EXPECT_EQ(plan.group_of_worker, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(plan.groups[3].stage, 1);
  EXPECT_EQ(plan.groups[3].tensor_rank, 1);
  EXPECT_EQ(plan.groups[3].id_owner, 3);
}

// A stage's tensor ranks are grouped all or none: here stage 0's rank 1
// has a replica on another host, so stage 0's rank 0 stays on the gRPC
// collectives too (NCCL on one rank and the ring on the other would sum
// the tensors both hold whole in other orders); stage 1 is grouped.
TEST(ReplicaDeviceGroupsTest, StageWithARankThatCannotJoin_NoneOfItsRanksGrouped) {
  std::vector<DeviceLinkMember> members;
  for (int g = 0; g < 12; ++g) members.push_back(Gpu("a", g));
  members[(2 * 2 + 0) * 2 + 1].host = "b";  // replica 2's stage 0, rank 1
  const ReplicaDeviceGroupPlan plan = PlanReplicaDeviceGroups(members, 3, 2, 2, {});
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.group_of_worker, (std::vector<int>{-1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 1}));
  EXPECT_EQ(plan.groups[0].stage, 1);
  EXPECT_EQ(plan.groups[1].tensor_rank, 1);
}

// Random clusters against the rules written out again: a position is
// grouped exactly when its stage is exact, every member has a host and an
// id, all share the first's host, and no two hold one GPU (equal addresses
// when both have one, else equal ordinals); a group lists every replica
// and carries the id of its lowest replica whose id no device group took
// (a position with none stays apart).
TEST(ReplicaDeviceGroupsTest, RandomClustersFollowTheRules) {
  std::mt19937 rng(21);
  int grouped = 0, kept_apart = 0;
  for (int instance = 0; instance < 600; ++instance) {
    const int replicas = 1 + static_cast<int>(rng() % 4);
    const int stages = 1 + static_cast<int>(rng() % 3);
    const int tensor = 1 + static_cast<int>(rng() % 2);
    std::vector<DeviceLinkMember> members(static_cast<size_t>(replicas) * stages * tensor);
    for (DeviceLinkMember& m : members) {
      m.host = rng() % 10 == 0 ? "" : (rng() % 6 == 0 ? "b" : "a");
      m.gpu_index = static_cast<int>(rng() % 8);
      m.gpu_pci_bus_id = rng() % 5 == 0 ? "" : "pci" + std::to_string(rng() % 8);
      m.nccl_unique_id = rng() % 8 == 0 ? "" : "id" + std::to_string(rng());
    }
    std::vector<int> compressed;
    for (int s = 0; s < stages; ++s) {
      if (rng() % 4 == 0) compressed.push_back(s);
    }
    std::vector<bool> taken(members.size());
    for (size_t w = 0; w < taken.size(); ++w) taken[w] = rng() % 5 == 0;
    const ReplicaDeviceGroupPlan plan =
        PlanReplicaDeviceGroups(members, replicas, stages, tensor, compressed, taken);
    for (int s = 0; s < stages; ++s) {
      // Whether each position of the stage could have a group alone; the
      // stage's positions have theirs all or none.
      std::vector<bool> wants(tensor);
      std::vector<int> owners(tensor, -1);
      for (int t = 0; t < tensor; ++t) {
        auto worker = [&](int r) { return (r * stages + s) * tensor + t; };
        bool want = replicas >= 2;
        for (int c : compressed) want = want && c != s;
        for (int r = 0; r < replicas; ++r) {
          const DeviceLinkMember& m = members[worker(r)];
          want = want && !m.host.empty() && !m.nccl_unique_id.empty() &&
                 m.host == members[worker(0)].host;
          for (int q = 0; q < r; ++q) {
            const DeviceLinkMember& o = members[worker(q)];
            const bool one_gpu = !m.gpu_pci_bus_id.empty() && !o.gpu_pci_bus_id.empty()
                                     ? m.gpu_pci_bus_id == o.gpu_pci_bus_id
                                     : m.gpu_index == o.gpu_index;
            want = want && !one_gpu;
          }
        }
        int owner = -1;  // the lowest replica's worker with a free id
        for (int r = 0; r < replicas && owner < 0; ++r) {
          if (!taken[worker(r)]) owner = worker(r);
        }
        wants[t] = want && owner >= 0;
        owners[t] = owner;
      }
      const bool whole_stage = std::all_of(wants.begin(), wants.end(), [](bool w) { return w; });
      for (int t = 0; t < tensor; ++t) {
        auto worker = [&](int r) { return (r * stages + s) * tensor + t; };
        const bool want = whole_stage;
        const int owner = owners[t];
        const int group = plan.group_of_worker[worker(0)];
        ASSERT_EQ(group >= 0, want) << "instance " << instance << ", stage " << s << ", rank " << t;
        for (int r = 0; r < replicas; ++r) ASSERT_EQ(plan.group_of_worker[worker(r)], group);
        if (!want) {
          ++kept_apart;
          continue;
        }
        ++grouped;
        const ReplicaDeviceGroupPlan::Group& g = plan.groups[group];
        EXPECT_EQ(g.stage, s);
        EXPECT_EQ(g.tensor_rank, t);
        EXPECT_EQ(g.id_owner, owner);
        EXPECT_EQ(g.group.nccl_unique_id(), members[owner].nccl_unique_id);
        EXPECT_EQ(g.group.replicas_size(), replicas);
        for (int r = 0; r < replicas; ++r) EXPECT_EQ(g.group.replicas(r), r);
      }
    }
  }
  // Both outcomes occur often enough for the comparison to mean something.
  EXPECT_GT(grouped, 50);
  EXPECT_GT(kept_apart, 50);
}

}  // namespace
}  // namespace pipetrain
