#include "coordinator/planner/fused_embedding_sync.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

bool IsTiedExchange(const v1::Instruction& in) {
  return (in.has_send() && in.send().tensor().kind() == v1::TENSOR_KIND_TIED_EMBEDDING_GRAD) ||
         (in.has_recv() && in.recv().tensor().kind() == v1::TENSOR_KIND_TIED_EMBEDDING_GRAD);
}

// Removes the stage's exchange (one Send and one Recv) and marks its
// AddTiedGradient fused.
absl::Status Fuse(int stage, int embed_stage, int head_stage, v1::Program* program) {
  v1::Program out;
  int exchanged = 0, added = 0;
  for (const v1::Instruction& in : program->instructions()) {
    if (IsTiedExchange(in)) {
      ++exchanged;
      continue;
    }
    v1::Instruction* copy = out.add_instructions();
    *copy = in;
    if (copy->has_add_tied_gradient()) {
      ++added;
      v1::Instruction::AddTiedGradient* add = copy->mutable_add_tied_gradient();
      add->set_fused(true);
      add->set_embed_stage(embed_stage);
      add->set_head_stage(head_stage);
    }
  }
  if (exchanged != 2 || added != 1) {
    return absl::InternalError(absl::StrCat("stage ", stage, "'s program has ", exchanged,
                                            " tied-gradient transfers and ", added,
                                            " AddTiedGradient; expected 2 and 1"));
  }
  *program = std::move(out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> FuseEmbeddingSync(const std::vector<Range>& backward,
                                       std::vector<v1::Program>* programs) {
  if (backward.size() != programs->size() || backward.empty()) {
    return absl::InternalError(
        absl::StrCat(backward.size(), " backward ranges for ", programs->size(), " programs"));
  }
  const int last_unit = backward.back().end - 1;
  int embed_stage = -1, head_stage = -1;
  for (size_t s = 0; s < backward.size(); ++s) {
    if (backward[s].begin <= 0 && 0 < backward[s].end) embed_stage = static_cast<int>(s);
    if (backward[s].begin <= last_unit && last_unit < backward[s].end) {
      head_stage = static_cast<int>(s);
    }
  }
  if (embed_stage < 0 || head_stage < 0) {
    return absl::InternalError("no stage runs the embedding's or the head's backward pass");
  }
  if (embed_stage == head_stage) return false;  // nothing is exchanged
  for (int s : {embed_stage, head_stage}) {
    absl::Status fused = Fuse(s, embed_stage, head_stage, &(*programs)[s]);
    if (!fused.ok()) return fused;
  }
  return true;
}

absl::StatusOr<bool> FuseEmbeddingSyncOfPrograms(std::vector<v1::Program>* programs) {
  // Stages' backward ranges follow each other: a stage without a Backward
  // (Bi-Partition lets a worker have none) runs the empty range where the
  // one before ended, so that the last stage's end stays the model's.
  std::vector<Range> backward;
  int end = 0;
  for (const v1::Program& program : *programs) {
    Range range{end, end};
    bool any = false;
    for (const v1::Instruction& in : program.instructions()) {
      if (!in.has_backward()) continue;
      const v1::UnitRange& units = in.backward().units();
      range = any ? Range{std::min(range.begin, units.begin()), std::max(range.end, units.end())}
                  : Range{units.begin(), units.end()};
      any = true;
    }
    backward.push_back(range);
    end = range.end;
  }
  return FuseEmbeddingSync(backward, programs);
}

double UnfusedEmbeddingSyncVolume(double bytes, int replicas) {
  // eq. 15: the replicas' all-reduce 2V (D-1)/D plus the two owners' 2V/2.
  return bytes * (3.0 * replicas - 2) / replicas;
}

double FusedEmbeddingSyncVolume(double bytes, int replicas) {
  // eq. 16: one all-reduce over 2D ranks, 2V (2D-1)/(2D).
  return bytes * (2.0 * replicas - 1) / replicas;
}

}  // namespace pipetrain
