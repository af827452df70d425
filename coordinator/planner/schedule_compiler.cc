#include "coordinator/planner/schedule_compiler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

v1::TensorKey Key(v1::TensorKind kind, int micro_batch, int unit) {
  v1::TensorKey key;
  key.set_kind(kind);
  key.set_micro_batch(micro_batch);
  key.set_unit(unit);
  return key;
}

void AddSend(v1::Program* p, const v1::TensorKey& key, int peer) {
  auto* send = p->add_instructions()->mutable_send();
  *send->mutable_tensor() = key;
  send->set_peer_stage(peer);
  send->set_path(v1::LINK_PATH_WIRE);  // device_links.h may move it to the device
}

void AddRecv(v1::Program* p, const v1::TensorKey& key, int peer) {
  auto* recv = p->add_instructions()->mutable_recv();
  *recv->mutable_tensor() = key;
  recv->set_peer_stage(peer);
  recv->set_path(v1::LINK_PATH_WIRE);
}

// Who runs what: the forward owner fo[u] and backward owner bo[u] of each
// unit, from per-worker ranges that have already been validated.
struct Owners {
  std::vector<int> fo, bo;
  Owners(const std::vector<Range>& forward, const std::vector<Range>& backward, int units)
      : fo(units), bo(units) {
    for (size_t w = 0; w < forward.size(); ++w) {
      for (int u = forward[w].begin; u < forward[w].end; ++u) fo[u] = static_cast<int>(w);
      for (int u = backward[w].begin; u < backward[w].end; ++u) bo[u] = static_cast<int>(w);
    }
  }
};

bool Contains(const Range& r, int u) { return r.begin <= u && u < r.end; }
bool Empty(const Range& r) { return r.begin == r.end; }

// The unit runs of B \ F on one worker: units whose backward pass runs here
// but whose forward pass ran elsewhere, so their saved tensors must be
// recomputed. At most two runs (before and after F).
std::vector<Range> RecomputeRuns(const Range& f, const Range& b) {
  if (Empty(b)) return {};
  if (Empty(f)) return {b};
  std::vector<Range> runs;
  const Range before{b.begin, std::min(b.end, f.begin)};
  const Range after{std::max(b.begin, f.end), b.end};
  if (before.begin < before.end) runs.push_back(before);
  if (after.begin < after.end) runs.push_back(after);
  return runs;
}

// The unit whose output a worker needs from another worker to recompute its
// runs (the input of a run not produced by its own forward pass), or -1.
// At most one run of a worker can need one (see RecomputeRuns).
int RoutedInputUnit(const Range& f, const Range& b) {
  for (const Range& run : RecomputeRuns(f, b)) {
    if (run.begin > 0 && !Contains(f, run.begin - 1)) return run.begin - 1;
  }
  return -1;
}

// Appends F(k), B(k) and the end-of-iteration steps for worker w (see the
// header for their content).
class WorkerEmitter {
 public:
  WorkerEmitter(v1::Program* program, const std::vector<Range>& forward,
                const std::vector<Range>& backward, const Owners& owners, int worker)
      : p_(program), fwd_(forward), bwd_(backward), own_(owners), w_(worker),
        f_(forward[worker]), b_(backward[worker]),
        last_unit_(static_cast<int>(owners.fo.size()) - 1) {}

  void Forward(int k) {
    if (Empty(f_)) return;
    if (f_.begin > 0)
      AddRecv(p_, Key(v1::TENSOR_KIND_ACTIVATION, k, f_.begin - 1), own_.fo[f_.begin - 1]);
    auto* f = p_->add_instructions()->mutable_forward();
    *f->mutable_units() = ToUnitRange(f_);
    f->set_micro_batch(k);
    if (f_.end <= last_unit_)
      AddSend(p_, Key(v1::TENSOR_KIND_ACTIVATION, k, f_.end - 1), own_.fo[f_.end]);
    // Inputs other workers need to recompute units whose forward ran here.
    // Never the tensor that worker gets as its forward input: a routed input
    // lies before F or after its end (RecomputeRuns), never at F.begin - 1.
    for (int other = 0; other < static_cast<int>(fwd_.size()); ++other) {
      const int unit = RoutedInputUnit(fwd_[other], bwd_[other]);
      if (unit >= 0 && own_.fo[unit] == w_)
        AddSend(p_, Key(v1::TENSOR_KIND_ACTIVATION, k, unit), other);
    }
  }

  void Backward(int k) {
    if (Empty(b_)) return;
    const int routed = RoutedInputUnit(f_, b_);
    if (routed >= 0) AddRecv(p_, Key(v1::TENSOR_KIND_ACTIVATION, k, routed), own_.fo[routed]);
    for (const Range& run : RecomputeRuns(f_, b_)) {
      auto* r = p_->add_instructions()->mutable_recompute();
      *r->mutable_units() = ToUnitRange(run);
      r->set_micro_batch(k);
    }
    if (b_.end <= last_unit_) {
      AddRecv(p_, Key(v1::TENSOR_KIND_ACTIVATION_GRAD, k, b_.end), own_.bo[b_.end]);
    }
    auto* b = p_->add_instructions()->mutable_backward();
    *b->mutable_units() = ToUnitRange(b_);
    b->set_micro_batch(k);
    if (b_.begin > 0)
      AddSend(p_, Key(v1::TENSOR_KIND_ACTIVATION_GRAD, k, b_.begin), own_.bo[b_.begin - 1]);
  }

  // The tied wte gradient: the backward owners of embed and head swap their
  // parts and both sum; then the optimizer step over this worker's backward
  // units; then weight sync from backward owners to forward owners.
  void EndOfIteration() {
    const int embed_owner = own_.bo[0], head_owner = own_.bo[last_unit_];
    if (embed_owner != head_owner && (w_ == embed_owner || w_ == head_owner)) {
      const int peer = w_ == embed_owner ? head_owner : embed_owner;
      const v1::TensorKey key = Key(v1::TENSOR_KIND_TIED_EMBEDDING_GRAD, -1, 0);
      AddSend(p_, key, peer);
      AddRecv(p_, key, peer);
    }
    if (w_ == embed_owner || w_ == head_owner) p_->add_instructions()->mutable_add_tied_gradient();
    if (!Empty(b_)) *p_->add_instructions()->mutable_optimizer_step()->mutable_units() = ToUnitRange(b_);
    for (int u = b_.begin; u < b_.end; ++u) {
      if (own_.fo[u] != w_) AddSend(p_, Key(v1::TENSOR_KIND_UNIT_WEIGHTS, -1, u), own_.fo[u]);
    }
    for (int u = f_.begin; u < f_.end; ++u) {
      if (own_.bo[u] != w_) AddRecv(p_, Key(v1::TENSOR_KIND_UNIT_WEIGHTS, -1, u), own_.bo[u]);
    }
  }

 private:
  v1::Program* p_;
  const std::vector<Range>& fwd_;
  const std::vector<Range>& bwd_;
  const Owners& own_;
  int w_;
  Range f_, b_;
  int last_unit_;
};

// One of the two sequences of ranges: each contiguous and in order, together
// covering [0, num_units).
absl::Status CheckSequence(const std::vector<Range>& ranges, int num_units, const char* what) {
  int expected = 0;
  for (size_t w = 0; w < ranges.size(); ++w) {
    if (ranges[w].begin != expected || ranges[w].end < ranges[w].begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " range of worker ", w, " is [", ranges[w].begin, ", ", ranges[w].end,
          "); ranges must follow each other from unit 0"));
    }
    expected = ranges[w].end;
  }
  if (expected != num_units) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ranges cover ", expected, " of ", num_units, " units"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBiPartitionRanges(const std::vector<Range>& forward,
                                       const std::vector<Range>& backward, int num_units) {
  if (forward.empty() || forward.size() != backward.size()) {
    return absl::InvalidArgumentError(absl::StrCat(forward.size(), " forward and ",
                                                   backward.size(), " backward ranges"));
  }
  if (auto status = CheckSequence(forward, num_units, "forward"); !status.ok()) return status;
  if (auto status = CheckSequence(backward, num_units, "backward"); !status.ok()) return status;
  for (size_t w = 0; w < forward.size(); ++w) {
    if (Empty(forward[w]) && Empty(backward[w])) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", w, " has neither forward nor backward units"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckRanges(const std::vector<Range>& ranges, int num_units) {
  int expected = 0;
  for (size_t s = 0; s < ranges.size(); ++s) {
    if (ranges[s].begin != expected || ranges[s].end <= ranges[s].begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " covers [", ranges[s].begin, ", ", ranges[s].end, "); stages must be "
          "non-empty and contiguous from unit 0"));
    }
    expected = ranges[s].end;
  }
  if (ranges.empty() || expected != num_units) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages cover ", expected, " of ", num_units, " units"));
  }
  return absl::OkStatus();
}

}  // namespace

v1::UnitRange ToUnitRange(const Range& r) {
  v1::UnitRange out;
  out.set_begin(r.begin);
  out.set_end(r.end);
  return out;
}

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  if (name == "1f1b") return Schedule::kOneFOneB;
  if (name == "gpipe") return Schedule::kGPipe;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name, "'; use 1f1b or gpipe"));
}

std::string ScheduleName(Schedule schedule) {
  return schedule == Schedule::kOneFOneB ? "1f1b" : "gpipe";
}

absl::StatusOr<std::vector<v1::Program>> CompilePrograms(const std::vector<Range>& ranges,
                                                         int num_units, int micro_batches,
                                                         Schedule schedule) {
  if (auto status = CheckRanges(ranges, num_units); !status.ok()) return status;
  return CompileBiPartitionPrograms(ranges, ranges, num_units, micro_batches, schedule);
}

absl::StatusOr<std::vector<v1::Program>> CompileBiPartitionPrograms(
    const std::vector<Range>& forward, const std::vector<Range>& backward, int num_units,
    int micro_batches, Schedule schedule) {
  if (auto status = ValidateBiPartitionRanges(forward, backward, num_units); !status.ok()) {
    return status;
  }
  if (micro_batches < 1) return absl::InvalidArgumentError("micro_batches must be >= 1");
  const int workers = static_cast<int>(forward.size());
  const int m = micro_batches;
  const Owners owners(forward, backward, num_units);
  std::vector<v1::Program> programs(workers);
  for (int w = 0; w < workers; ++w) {
    WorkerEmitter emit(&programs[w], forward, backward, owners, w);
    if (schedule == Schedule::kGPipe) {
      for (int k = 0; k < m; ++k) emit.Forward(k);
      for (int k = 0; k < m; ++k) emit.Backward(k);
    } else {
      const int warmup = std::min(workers - 1 - w, m);
      for (int k = 0; k < warmup; ++k) emit.Forward(k);
      for (int i = 0; i < m - warmup; ++i) {
        emit.Forward(warmup + i);
        emit.Backward(i);
      }
      for (int k = m - warmup; k < m; ++k) emit.Backward(k);
    }
    emit.EndOfIteration();
  }
  return programs;
}

absl::StatusOr<std::vector<v1::Program>> CompileEvalPrograms(const std::vector<Range>& forward,
                                                             int num_units,
                                                             int micro_batches) {
  if (auto status = CheckSequence(forward, num_units, "forward"); !status.ok()) return status;
  if (micro_batches < 1) return absl::InvalidArgumentError("micro_batches must be >= 1");
  std::vector<int> owner(num_units);
  for (size_t w = 0; w < forward.size(); ++w) {
    for (int u = forward[w].begin; u < forward[w].end; ++u) owner[u] = static_cast<int>(w);
  }
  std::vector<v1::Program> programs(forward.size());
  for (size_t w = 0; w < forward.size(); ++w) {
    const Range& f = forward[w];
    if (Empty(f)) continue;
    v1::Program* p = &programs[w];
    for (int k = 0; k < micro_batches; ++k) {
      if (f.begin > 0)
        AddRecv(p, Key(v1::TENSOR_KIND_EVAL_ACTIVATION, k, f.begin - 1), owner[f.begin - 1]);
      auto* fwd = p->add_instructions()->mutable_forward();
      *fwd->mutable_units() = ToUnitRange(f);
      fwd->set_micro_batch(k);
      fwd->set_validation(true);
      if (f.end < num_units)
        AddSend(p, Key(v1::TENSOR_KIND_EVAL_ACTIVATION, k, f.end - 1), owner[f.end]);
    }
  }
  return programs;
}

}  // namespace pipetrain
