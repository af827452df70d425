#include "worker/model/unit.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common/logging.h"
#include "common/philox.h"
#include "kernels/cpu/elementwise.h"
#include "worker/model/attention_unit.h"
#include "worker/model/embed_unit.h"
#include "worker/model/head_unit.h"
#include "worker/model/mlp_unit.h"
#include "worker/model/partition_count.h"

namespace pipetrain {

int64_t UnitContext::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : saved) total += t.size_bytes();
  return total;
}

std::vector<Parameter*> Unit::parameters() {
  std::vector<Parameter*> out;
  out.reserve(params_.size());
  for (auto& p : params_) out.push_back(p.get());
  return out;
}

void Unit::ZeroGrads() {
  std::vector<Tensor*> grads;
  for (auto& p : params_) grads.push_back(&p->grad);
  backend_->ZeroAll(grads);  // one call: a device backend's few launches
}

void Unit::set_tensor_parallel_partitions(int forward, int backward) {
  PT_CHECK(forward >= 1 && backward >= 1) << "partitions " << forward << ", " << backward;
  partitions_forward_ = forward;
  partitions_backward_ = backward;
}

int Unit::TensorParallelPartitions(int samples, bool forward) const {
  if (tp_size() < 2 || samples < 1) return 1;  // nothing to overlap
  return PartitionsRun(forward ? partitions_forward_ : partitions_backward_, samples);
}

void Unit::WaitTensorParallelSums() {
  for (Ticket& ticket : tickets_) {
    tp_->WaitAllReduce(ticket.id);
    if (ticket.on_done) ticket.on_done();
  }
  tickets_.clear();
}

void Unit::StartTensorParallelTokenSparseSum(Tensor& data, std::vector<float> local_scores,
                                             int seq_len, Tensor mask, int64_t row) {
  // The group writes the flags when the sum is waited for, which may be
  // after this pass returns (streamed): they live with the ticket.
  auto flags = std::make_shared<std::vector<uint8_t>>();
  const int ticket = tp_->StartTokenSparseSum(data, std::move(local_scores), seq_len, flags.get());
  tickets_.push_back({ticket, [flags, mask, row]() mutable {
                        PT_CHECK(row + static_cast<int64_t>(flags->size()) <= mask.numel())
                            << "kept flags of rows " << row << " + " << flags->size()
                            << " for a mask of " << mask.numel();
                        for (size_t r = 0; r < flags->size(); ++r) {
                          mask.data()[row + static_cast<int64_t>(r)] =
                              (*flags)[r] != 0 ? 1.0f : 0.0f;
                        }
                      }});
}

std::vector<uint8_t> Unit::KeptRows(const Tensor& mask, int64_t begin, int64_t end) {
  std::vector<uint8_t> kept;
  kept.reserve(static_cast<size_t>(end - begin));
  for (int64_t r = begin; r < end; ++r) kept.push_back(mask.data()[r] != 0 ? 1 : 0);
  return kept;
}

Tensor Unit::ZeroDroppedRows(const Tensor& x, const std::vector<uint8_t>& kept) const {
  Tensor host = x.on_device() ? backend_->Download(x) : x.Clone();
  const int64_t width = host.numel() == 0 ? 1 : host.shape().back();
  PT_CHECK(static_cast<int64_t>(kept.size()) * width == host.numel())
      << name_ << ": a mask of " << kept.size() << " rows for " << host.numel() << " values";
  for (size_t r = 0; r < kept.size(); ++r) {
    if (!kept[r]) std::fill_n(host.data() + r * width, width, 0.0f);
  }
  if (!x.on_device()) return host;
  Tensor out = backend_->Empty(x.shape());
  backend_->CopyFromHost(host, &out);
  return out;
}

std::vector<float> Unit::RowSquaredNorms(const Tensor& x) const {
  const Tensor host = backend_->Download(x);
  const int64_t width = host.numel() == 0 ? 1 : host.shape().back();
  // The scores only rank rows, and the group sums its ranks' scores in
  // float (TensorParallelComm::StartTokenSparseSum): a finite row whose
  // squared norm is beyond the float range (a norm above ~1.8e19) would be
  // an undefined cast here and an infinite sum there, refused as
  // non-finite activations. So a finite sum is capped at a share of
  // FLT_MAX that the group's sum cannot overflow (half of it, a margin for
  // the rounding of that sum); the order changes only among capped rows.
  // NaN and infinite sums stay as they are: the group must refuse them.
  const double cap = double{FLT_MAX} / (2.0 * tp_size());
  std::vector<float> norms(static_cast<size_t>(host.numel() / width));
  for (size_t r = 0; r < norms.size(); ++r) {
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) {
      const double v = host.data()[r * width + i];
      sum += v * v;
    }
    norms[r] = static_cast<float>(std::isfinite(sum) ? std::min(sum, cap) : sum);
  }
  return norms;
}

bool Unit::TakeStreamOutput() {
  const bool stream =
      stream_output_ && tp_ != nullptr && tp_->size() > 1 && streams_tensor_parallel();
  stream_output_ = false;
  return stream;
}

void Unit::AddPendingOutputRows(int64_t begin, int64_t end, std::function<void()> finish) {
  PT_CHECK(!tickets_.empty()) << name_ << ": pending rows without an all-reduce";
  Ticket ticket = std::move(tickets_.back());
  tickets_.pop_back();
  if (ticket.on_done) {
    finish = [on_done = std::move(ticket.on_done), then = std::move(finish)]() mutable {
      on_done();
      then();
    };
  }
  pending_out_.push_back({begin, end, ticket.id, tp_, std::move(finish), false});
}

void Unit::AddPendingResidualRows(Tensor x, Tensor y, int64_t row, int64_t rows, int64_t width) {
  AddPendingOutputRows(row, row + rows, [this, x, y, row, rows, width]() mutable {
    backend_->Add(y.data() + row * width, x.data() + row * width, rows * width,
                  y.data() + row * width);
  });
}

void Unit::AddPendingLayerNormBackwardRows(Tensor x, Tensor mean, Tensor rstd, Tensor dln,
                                           Tensor dx, Tensor dy, Parameter* ln_w, Parameter* ln_b,
                                           int64_t row, int64_t rows, int64_t width) {
  AddPendingOutputRows(
      row, row + rows, [this, x, mean, rstd, dln, dx, dy, ln_w, ln_b, row, rows, width]() mutable {
        backend_->LayerNormBackward(x.data() + row * width, ln_w->value.data(), mean.data() + row,
                                    rstd.data() + row, dln.data() + row * width,
                                    static_cast<int>(rows), static_cast<int>(width),
                                    dx.data() + row * width, ln_w->grad.data(), ln_b->grad.data());
        backend_->AddInPlace(dx.data() + row * width, dy.data() + row * width, rows * width);
      });
}

void Unit::PassPendingTo(Unit* next) {
  PT_CHECK(next->pending_in_.empty()) << next->name_ << " still holds pending input rows";
  next->pending_in_ = std::move(pending_out_);
  pending_out_.clear();
}

void Unit::ResolveInputRows(int64_t begin, int64_t end) {
  bool all_done = true;
  for (PendingRows& p : pending_in_) {
    if (!p.done && p.begin < end && begin < p.end) {
      p.comm->WaitAllReduce(p.ticket);
      p.finish();
      p.done = true;
    }
    all_done = all_done && p.done;
  }
  if (all_done) pending_in_.clear();
}

Parameter* Unit::AddParameter(std::string name, const Shape& shape, ParamInit init, float init_std,
                              bool is_matrix, ParameterShard::Split split, int column_blocks) {
  auto p = std::make_unique<Parameter>();
  p->name = std::move(name);
  p->shard.rank = tp_rank();
  p->shard.ranks = tp_size();
  Shape local = shape;
  if (tp_size() > 1 && split != ParameterShard::Split::kNone) {
    p->shard.split = split;
    p->shard.column_blocks = column_blocks;
    p->shard.full_shape = shape;
    local = ShardShape(p->shard);
  }
  p->value = backend_->Zeros(local);
  p->grad = backend_->Zeros(local);
  p->init = init;
  p->init_std = init_std;
  p->is_matrix = is_matrix;
  params_.push_back(std::move(p));
  return params_.back().get();
}

Parameter* FindParameter(Unit& unit, const std::string& name) {
  for (Parameter* p : unit.parameters()) {
    if (p->name == name) return p;
  }
  return nullptr;
}

Parameter* TieHeadToEmbedding(Unit& embed, Unit& head) {
  Parameter* embed_wte = FindParameter(embed, "wte.weight");
  Parameter* head_wte = FindParameter(head, "wte.weight");
  PT_CHECK(embed_wte != nullptr && head_wte != nullptr) << "tying units without wte.weight";
  head_wte->value = embed_wte->value;
  return head_wte;
}

void AddTiedGradient(Backend* backend, Parameter* holder, const Tensor& other_part) {
  PT_CHECK(holder->grad.on_device() == other_part.on_device())
      << "tied gradient of " << holder->name << ": one part on the host, one on a device";
  PT_CHECK(holder->grad.numel() == other_part.numel())
      << "tied gradient of " << holder->name << ": " << holder->grad.numel() << " vs "
      << other_part.numel() << " elements";
  backend->AddInPlace(holder->grad.data(), other_part.data(), other_part.numel());
}

std::unique_ptr<Unit> MakeUnit(const GptConfig& config, int index, Backend* backend,
                               TensorParallelComm* tp) {
  PT_CHECK(ValidateGptConfig(config).ok()) << "invalid GptConfig";
  PT_CHECK(backend != nullptr) << "MakeUnit without a backend";
  if (tp != nullptr) {
    const absl::Status status = ValidateTensorParallel(config, tp->size());
    PT_CHECK(status.ok()) << status;
  }
  const int layer = UnitLayer(config, index);
  switch (UnitKindAt(config, index)) {
    case UnitKind::kEmbed:
      return std::make_unique<EmbedUnit>(config, backend, tp);
    case UnitKind::kAttention:
      return std::make_unique<AttentionUnit>(config, layer, backend, tp);
    case UnitKind::kMlp:
      return std::make_unique<MlpUnit>(config, layer, backend, tp);
    case UnitKind::kHead:
      return std::make_unique<HeadUnit>(config, backend, tp);
  }
  return nullptr;
}

void InitializeParameters(Unit* unit, uint64_t seed) {
  Backend* backend = unit->backend();
  for (Parameter* p : unit->parameters()) {
    Tensor host = p->value.on_device() ? Tensor::Zeros(p->value.shape()) : p->value;
    switch (p->init) {
      case ParamInit::kZeros:
        host.Fill(0.0f);
        break;
      case ParamInit::kOnes:
        host.Fill(1.0f);
        break;
      case ParamInit::kNormal:
        if (p->shard.sharded()) {
          // The unsplit tensor's values, of which this rank keeps its part.
          Tensor full = Tensor::Zeros(p->shard.full_shape);
          FillNormal(seed, HashName(p->name), 0.0f, p->init_std, full.data(), full.numel());
          host.CopyFrom(SliceShard(full, p->shard));
        } else {
          FillNormal(seed, HashName(p->name), 0.0f, p->init_std, host.data(), host.numel());
        }
        break;
    }
    if (p->value.on_device()) backend->CopyFromHost(host, &p->value);
    backend->Fill(&p->grad, 0.0f);
  }
}

}  // namespace pipetrain
