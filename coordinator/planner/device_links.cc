#include "coordinator/planner/device_links.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "common/logging.h"

namespace pipetrain {
namespace {

using Key = std::tuple<int, int, int>;  // kind, micro_batch, unit

Key KeyOf(const v1::TensorKey& t) { return {t.kind(), t.micro_batch(), t.unit()}; }

// Raw activations and their gradients; everything else stays on the wire.
bool MayUseDevice(const v1::Instruction::Send& send) {
  const v1::TensorKind kind = send.tensor().kind();
  return (kind == v1::TENSOR_KIND_ACTIVATION || kind == v1::TENSOR_KIND_ACTIVATION_GRAD) &&
         send.codec().empty();
}

void ResetPaths(std::vector<v1::Program>* programs) {
  for (v1::Program& program : *programs) {
    for (v1::Instruction& in : *program.mutable_instructions()) {
      if (in.has_send()) in.mutable_send()->set_path(v1::LINK_PATH_WIRE);
      if (in.has_recv()) in.mutable_recv()->set_path(v1::LINK_PATH_WIRE);
    }
  }
}

// Per stage, its candidate group (one per host), or -1 when the stage is
// not eligible or a lower stage of its host holds its GPU.
std::vector<int> CandidateGroups(const std::vector<DeviceLinkMember>& members) {
  std::map<std::string, int> group_of_host;
  std::map<std::string, std::vector<size_t>> kept_on_host;  // stages holding a GPU
  std::vector<int> candidate(members.size(), -1);
  for (size_t s = 0; s < members.size(); ++s) {
    const DeviceLinkMember& m = members[s];
    if (m.host.empty() || m.nccl_unique_id.empty()) continue;
    std::vector<size_t>& kept = kept_on_host[m.host];
    const bool gpu_taken =
        std::any_of(kept.begin(), kept.end(), [&](size_t t) { return SameGpu(members[t], m); });
    if (gpu_taken) continue;
    kept.push_back(s);
    const int next = static_cast<int>(group_of_host.size());
    candidate[s] = group_of_host.emplace(m.host, next).first->second;
  }
  return candidate;
}

enum class LinkOutcome { kNone, kDevice, kOrderDiffers };

// The link a -> b: marks it DEVICE when the device-eligible sends of `from`
// to b name the same tensors in the same order as the receives of `to` from
// a of those tensors.
LinkOutcome MarkLink(int a, int b, v1::Program* from, v1::Program* to) {
  std::vector<v1::Instruction::Send*> sends;
  std::vector<Key> sent;
  for (v1::Instruction& in : *from->mutable_instructions()) {
    if (!in.has_send() || in.send().peer_stage() != b || !MayUseDevice(in.send())) continue;
    sends.push_back(in.mutable_send());
    sent.push_back(KeyOf(in.send().tensor()));
  }
  if (sends.empty()) return LinkOutcome::kNone;
  const std::set<Key> wanted(sent.begin(), sent.end());
  std::vector<v1::Instruction::Recv*> recvs;
  std::vector<Key> received;
  for (v1::Instruction& in : *to->mutable_instructions()) {
    if (!in.has_recv() || in.recv().peer_stage() != a) continue;
    const Key key = KeyOf(in.recv().tensor());
    if (wanted.count(key) == 0) continue;
    recvs.push_back(in.mutable_recv());
    received.push_back(key);
  }
  if (sent != received) return LinkOutcome::kOrderDiffers;
  for (v1::Instruction::Send* send : sends) send->set_path(v1::LINK_PATH_DEVICE);
  for (v1::Instruction::Recv* recv : recvs) recv->set_path(v1::LINK_PATH_DEVICE);
  return LinkOutcome::kDevice;
}

}  // namespace

bool SameGpu(const DeviceLinkMember& a, const DeviceLinkMember& b) {
  if (!a.gpu_pci_bus_id.empty() && !b.gpu_pci_bus_id.empty()) {
    return a.gpu_pci_bus_id == b.gpu_pci_bus_id;
  }
  return a.gpu_index == b.gpu_index;
}

DeviceLinkPlan PlanDeviceLinks(const std::vector<DeviceLinkMember>& members,
                               std::vector<v1::Program>* programs) {
  PT_CHECK(members.size() == programs->size())
      << members.size() << " members for " << programs->size() << " programs";
  ResetPaths(programs);
  const std::vector<int> candidate = CandidateGroups(members);
  const int stages = static_cast<int>(members.size());
  DeviceLinkPlan plan;
  std::vector<bool> linked(stages, false);
  std::vector<std::pair<int, int>> links;  // (from, to), in marking order
  for (int a = 0; a < stages; ++a) {
    for (int b = 0; b < stages; ++b) {
      if (a == b || candidate[a] < 0 || candidate[a] != candidate[b]) continue;
      switch (MarkLink(a, b, &(*programs)[a], &(*programs)[b])) {
        case LinkOutcome::kDevice:
          linked[a] = linked[b] = true;
          links.push_back({a, b});
          break;
        case LinkOutcome::kOrderDiffers:
          plan.order_differs.push_back({a, b});
          break;
        case LinkOutcome::kNone:
          break;
      }
    }
  }
  plan.group_of_stage.assign(stages, -1);
  std::map<int, int> formed;  // candidate group -> index into plan.groups
  for (int s = 0; s < stages; ++s) {
    if (!linked[s]) continue;
    const auto [it, first] = formed.emplace(candidate[s], static_cast<int>(plan.groups.size()));
    if (first) {
      DeviceLinkGroup group;
      group.group.set_nccl_unique_id(members[s].nccl_unique_id);
      group.id_owner_stage = s;
      plan.groups.push_back(std::move(group));
    }
    plan.groups[it->second].group.add_stages(s);
    plan.group_of_stage[s] = it->second;
  }
  for (const auto& [from, to] : links) {
    v1::DeviceLink* link = plan.groups[plan.group_of_stage[from]].group.add_links();
    link->set_from_stage(from);
    link->set_to_stage(to);
  }
  return plan;
}

ReplicatedDeviceLinkPlan PlanReplicatedDeviceLinks(const std::vector<DeviceLinkMember>& members,
                                                   int replicas,
                                                   std::vector<v1::Program>* programs) {
  const int stages = static_cast<int>(programs->size());
  PT_CHECK(replicas >= 1 && members.size() == static_cast<size_t>(replicas) * stages)
      << members.size() << " members for " << replicas << " replicas of " << stages << " stages";
  ReplicatedDeviceLinkPlan out;
  if (replicas == 1) {
    out.links = PlanDeviceLinks(members, programs);
    return out;
  }
  std::vector<v1::Program> marked;  // replica 0's marks, which every replica must share
  out.links.group_of_stage.assign(members.size(), -1);
  for (int r = 0; r < replicas && !out.replicas_differ; ++r) {
    std::vector<v1::Program> copy = *programs;
    const DeviceLinkPlan plan =
        PlanDeviceLinks({members.begin() + r * stages, members.begin() + (r + 1) * stages}, &copy);
    if (r == 0) {
      marked = std::move(copy);
    } else {
      for (int s = 0; s < stages && !out.replicas_differ; ++s) {
        out.replicas_differ = copy[s].SerializeAsString() != marked[s].SerializeAsString();
      }
    }
    const int offset = r * stages;
    for (const DeviceLinkGroup& g : plan.groups) {
      DeviceLinkGroup global;
      for (int s : g.group.stages()) {
        global.group.add_stages(s + offset);
        out.links.group_of_stage[s + offset] = static_cast<int>(out.links.groups.size());
      }
      for (const v1::DeviceLink& link : g.group.links()) {
        v1::DeviceLink* l = global.group.add_links();
        l->set_from_stage(link.from_stage() + offset);
        l->set_to_stage(link.to_stage() + offset);
      }
      global.id_owner_stage = global.group.stages(r % global.group.stages_size());
      global.group.set_nccl_unique_id(members[global.id_owner_stage].nccl_unique_id);
      out.links.groups.push_back(std::move(global));
    }
    for (const auto& [from, to] : plan.order_differs) {
      out.links.order_differs.push_back({from + offset, to + offset});
    }
  }
  if (out.replicas_differ) {
    ResetPaths(programs);  // every path back on the wire
    out.links.groups.clear();
    out.links.group_of_stage.assign(members.size(), -1);
    return out;
  }
  *programs = std::move(marked);
  return out;
}

}  // namespace pipetrain
