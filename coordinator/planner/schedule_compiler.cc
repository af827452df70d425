#include "coordinator/planner/schedule_compiler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

v1::UnitRange ToProto(const Range& r) {
  v1::UnitRange out;
  out.set_begin(r.begin);
  out.set_end(r.end);
  return out;
}

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
}

void AddRecv(v1::Program* p, const v1::TensorKey& key, int peer) {
  auto* recv = p->add_instructions()->mutable_recv();
  *recv->mutable_tensor() = key;
  recv->set_peer_stage(peer);
}

// Appends F(k) or B(k) for stage s (see the header for their content).
class StageEmitter {
 public:
  StageEmitter(v1::Program* program, const Range& range, int stage, int stages)
      : p_(program), r_(range), s_(stage), last_(stages - 1) {}

  void Forward(int k) {
    if (s_ > 0) AddRecv(p_, Key(v1::ACTIVATION, k, r_.begin - 1), s_ - 1);
    auto* f = p_->add_instructions()->mutable_forward();
    *f->mutable_units() = ToProto(r_);
    f->set_micro_batch(k);
    if (s_ < last_) AddSend(p_, Key(v1::ACTIVATION, k, r_.end - 1), s_ + 1);
  }

  void Backward(int k) {
    if (s_ < last_) AddRecv(p_, Key(v1::ACTIVATION_GRAD, k, r_.end), s_ + 1);
    auto* b = p_->add_instructions()->mutable_backward();
    *b->mutable_units() = ToProto(r_);
    b->set_micro_batch(k);
    if (s_ > 0) AddSend(p_, Key(v1::ACTIVATION_GRAD, k, r_.begin), s_ - 1);
  }

  // The tied wte gradient: stage 0 and stage P-1 swap parts, then both sum.
  void TiedGradientAndStep() {
    if (last_ > 0 && (s_ == 0 || s_ == last_)) {
      const int peer = s_ == 0 ? last_ : 0;
      const v1::TensorKey key = Key(v1::TIED_EMBEDDING_GRAD, -1, 0);
      AddSend(p_, key, peer);
      AddRecv(p_, key, peer);
    }
    if (s_ == 0 || s_ == last_) p_->add_instructions()->mutable_add_tied_gradient();
    *p_->add_instructions()->mutable_optimizer_step()->mutable_units() = ToProto(r_);
  }

 private:
  v1::Program* p_;
  Range r_;
  int s_, last_;
};

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
  if (micro_batches < 1) return absl::InvalidArgumentError("micro_batches must be >= 1");
  const int stages = static_cast<int>(ranges.size());
  const int m = micro_batches;
  std::vector<v1::Program> programs(stages);
  for (int s = 0; s < stages; ++s) {
    StageEmitter emit(&programs[s], ranges[s], s, stages);
    if (schedule == Schedule::kGPipe) {
      for (int k = 0; k < m; ++k) emit.Forward(k);
      for (int k = 0; k < m; ++k) emit.Backward(k);
    } else {
      const int warmup = std::min(stages - 1 - s, m);
      for (int k = 0; k < warmup; ++k) emit.Forward(k);
      for (int i = 0; i < m - warmup; ++i) {
        emit.Forward(warmup + i);
        emit.Backward(i);
      }
      for (int k = m - warmup; k < m; ++k) emit.Backward(k);
    }
    emit.TiedGradientAndStep();
  }
  return programs;
}

}  // namespace pipetrain
