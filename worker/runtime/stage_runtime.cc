#include "worker/runtime/stage_runtime.h"

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/program_text.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status Internal(const std::string& what) {
  return absl::InternalError(absl::StrCat("program error: ", what));
}

// Takes map[key] out of `m`; INTERNAL naming `what` when absent.
absl::StatusOr<Tensor> TakeFrom(std::map<int, Tensor>& m, int key, const std::string& what) {
  auto it = m.find(key);
  if (it == m.end()) return Internal(absl::StrCat(what, " for micro-batch ", key, " missing"));
  Tensor t = std::move(it->second);
  m.erase(it);
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StageRuntime>> StageRuntime::Create(const StageSetup& setup,
                                                                   const Dataset* dataset,
                                                                   Transport* transport) {
  RETURN_IF_ERROR(ValidateTrainConfig(setup.train));
  const int units = NumUnits(setup.train.model);
  if (setup.first_unit < 0 || setup.first_unit >= setup.end_unit || setup.end_unit > units) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", setup.stage, " owns units [",
                                                   setup.first_unit, ", ", setup.end_unit,
                                                   ") of a ", units, "-unit model"));
  }
  const bool needs_data = setup.first_unit == 0 || setup.end_unit == units;
  if (needs_data && dataset == nullptr) {
    return absl::InvalidArgumentError("the stage owning embed or head needs the dataset");
  }
  if (setup.num_stages > 1 && transport == nullptr) {
    return absl::InvalidArgumentError("a multi-stage program needs a transport");
  }
  return std::unique_ptr<StageRuntime>(new StageRuntime(setup, dataset, transport));
}

StageRuntime::StageRuntime(const StageSetup& setup, const Dataset* dataset,
                           Transport* transport)
    : setup_(setup),
      dataset_(dataset),
      transport_(transport),
      optimizer_(setup.train.adam, setup.train.decay) {
  for (int u = setup.first_unit; u < setup.end_unit; ++u) {
    units_.push_back(MakeUnit(setup.train.model, u));
    InitializeParameters(units_.back().get(), setup.train.seed);
  }
  // Owning both ends of the model: tie the values as GptModel does.
  if (setup.first_unit == 0 && setup.end_unit == NumUnits(setup.train.model)) {
    TieHeadToEmbedding(*units_.front(), *units_.back());
  }
}

std::vector<Parameter*> StageRuntime::parameters() const {
  std::vector<Parameter*> out;
  std::set<std::string> seen;
  for (const auto& unit : units_) {
    for (Parameter* p : unit->parameters()) {
      if (seen.insert(p->name).second) out.push_back(p);
    }
  }
  return out;
}

std::string StageRuntime::current_instruction() const {
  AnnotatedMutexLock lock(&status_mu_);
  return current_;
}

Unit* StageRuntime::OwnedUnit(int index) {
  if (index < setup_.first_unit || index >= setup_.end_unit) return nullptr;
  return units_[index - setup_.first_unit].get();
}

TokenBatch StageRuntime::BatchFor(int micro_batch) const {
  const int per = setup_.train.batch_size / setup_.train.micro_batches;
  if (dataset_ == nullptr) return TokenBatch{per, setup_.train.seq_len, {}, {}};
  return dataset_->TrainBatch(setup_.train.seed, iteration_, int64_t{micro_batch} * per, per);
}

Parameter* StageRuntime::TiedHolder() {
  // The embedding's copy when this stage has it, else the head's.
  Unit& holder = setup_.first_unit == 0 ? *units_.front() : *units_.back();
  return FindParameter(holder, "wte.weight");
}

absl::StatusOr<IterationResult> StageRuntime::RunIteration(int64_t iteration) {
  iteration_ = iteration;
  for (auto& unit : units_) unit->ZeroGrads();
  inputs_.clear(), outputs_.clear(), grads_in_.clear(), grads_out_.clear();
  contexts_.clear(), losses_.clear();
  tied_received_ = Tensor();
  IterationResult result;
  result.iteration = iteration;
  const auto start = Clock::now();
  for (const v1::Instruction& in : setup_.program.instructions()) {
    {
      AnnotatedMutexLock lock(&status_mu_);
      current_ = DescribeInstruction(in);
    }
    absl::Status status = Execute(in, iteration, &result);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("stage ", setup_.stage, ", iteration ",
                                                      iteration, ", '", DescribeInstruction(in),
                                                      "': ", status.message()));
    }
  }
  for (const auto& [mb, loss] : losses_) result.micro_batch_losses.push_back(loss);
  result.busy_seconds = SecondsSince(start) - result.idle_seconds;
  AnnotatedMutexLock lock(&status_mu_);
  current_ = "idle";
  return result;
}

absl::Status StageRuntime::Execute(const v1::Instruction& in, int64_t iteration,
                                   IterationResult* result) {
  const auto start = Clock::now();
  absl::Status status;
  const char* phase = nullptr;
  switch (in.op_case()) {
    case v1::Instruction::kForward:
      phase = "forward";
      status = Forward(in.forward());
      break;
    case v1::Instruction::kBackward:
      phase = "backward";
      status = Backward(in.backward());
      break;
    case v1::Instruction::kSend:
      phase = "send";
      status = Send(in.send(), iteration, result);
      break;
    case v1::Instruction::kRecv:
      status = Recv(in.recv(), iteration);
      result->idle_seconds += SecondsSince(start);
      return status;
    case v1::Instruction::kAddTiedGradient:
      phase = "tied";
      status = AddTied();
      break;
    case v1::Instruction::kOptimizerStep:
      optimizer_.Step(parameters());
      phase = "optimizer";
      break;
    case v1::Instruction::OP_NOT_SET: return Internal("empty instruction");
  }
  result->phase_seconds[phase] += SecondsSince(start);
  return status;
}

absl::Status StageRuntime::Forward(const v1::Instruction::Forward& f) {
  const int mb = f.micro_batch();
  const int last_unit = NumUnits(setup_.train.model) - 1;
  Tensor x;
  if (f.units().begin() > 0) {
    ASSIGN_OR_RETURN(x, TakeFrom(inputs_, mb, "input activation"));
  }
  const TokenBatch batch = BatchFor(mb);
  std::vector<UnitContext>& ctx = contexts_[mb];
  ctx.resize(f.units().end() - f.units().begin());
  for (int u = f.units().begin(); u < f.units().end(); ++u) {
    Unit* unit = OwnedUnit(u);
    if (unit == nullptr) return Internal(absl::StrCat("unit ", u, " is not owned here"));
    x = unit->Forward(x, batch, &ctx[u - f.units().begin()]);
  }
  if (f.units().end() - 1 == last_unit) {
    losses_[mb] = x[0];
  } else {
    outputs_[mb] = x;
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::Backward(const v1::Instruction::Backward& b) {
  const int mb = b.micro_batch();
  const int last_unit = NumUnits(setup_.train.model) - 1;
  auto ctx_it = contexts_.find(mb);
  if (ctx_it == contexts_.end()) return Internal(absl::StrCat("no forward of micro-batch ", mb));
  Tensor dy;
  if (b.units().end() - 1 == last_unit) {
    // dL/dloss of one micro-batch: the mean over micro-batches scales by 1/m.
    dy = Tensor::FromVector({1}, {1.0f / setup_.train.micro_batches});
  } else {
    ASSIGN_OR_RETURN(dy, TakeFrom(grads_in_, mb, "output gradient"));
  }
  const TokenBatch batch = BatchFor(mb);
  for (int u = b.units().end() - 1; u >= b.units().begin(); --u) {
    Unit* unit = OwnedUnit(u);
    if (unit == nullptr) return Internal(absl::StrCat("unit ", u, " is not owned here"));
    dy = unit->Backward(dy, batch, ctx_it->second[u - b.units().begin()]);
  }
  contexts_.erase(ctx_it);
  if (b.units().begin() > 0) grads_out_[mb] = dy;
  return absl::OkStatus();
}

absl::Status StageRuntime::Send(const v1::Instruction::Send& s, int64_t iteration,
                                IterationResult* result) {
  const v1::TensorKey& key = s.tensor();
  Tensor tensor;
  switch (key.kind()) {
    case v1::ACTIVATION: {
      ASSIGN_OR_RETURN(tensor, TakeFrom(outputs_, key.micro_batch(), "activation to send"));
      break;
    }
    case v1::ACTIVATION_GRAD: {
      ASSIGN_OR_RETURN(tensor, TakeFrom(grads_out_, key.micro_batch(), "gradient to send"));
      break;
    }
    case v1::TIED_EMBEDDING_GRAD: {
      Parameter* holder = TiedHolder();
      if (holder == nullptr) return Internal("no tied embedding on this stage");
      tensor = holder->grad;
      break;
    }
    default: return Internal("send of an unknown tensor kind");
  }
  result->sent_bytes[{s.peer_stage(), v1::TensorKind_Name(key.kind())}] += tensor.size_bytes();
  return transport_->Send(s.peer_stage(), MakeAddress(setup_.job_id, iteration, key), tensor);
}

absl::Status StageRuntime::Recv(const v1::Instruction::Recv& r, int64_t iteration) {
  const v1::TensorKey& key = r.tensor();
  const TensorAddress address = MakeAddress(setup_.job_id, iteration, key);
  ASSIGN_OR_RETURN(Tensor t, transport_->Recv(r.peer_stage(), address, setup_.recv_timeout));
  const GptConfig& m = setup_.train.model;
  const int per = setup_.train.batch_size / setup_.train.micro_batches;
  const Shape expected = key.kind() == v1::TIED_EMBEDDING_GRAD
                             ? Shape{m.vocab_size, m.d_model}
                             : Shape{per, setup_.train.seq_len, m.d_model};
  if (t.numel() != NumElements(expected)) {
    return absl::InvalidArgumentError(absl::StrCat(
        address.DebugString(), " from stage ", r.peer_stage(), " has shape ",
        ShapeToString(t.shape()), "; expected ", ShapeToString(expected)));
  }
  t = t.Reshape(expected);
  switch (key.kind()) {
    case v1::ACTIVATION: inputs_[key.micro_batch()] = t; break;
    case v1::ACTIVATION_GRAD: grads_in_[key.micro_batch()] = t; break;
    case v1::TIED_EMBEDDING_GRAD: tied_received_ = t; break;
    default: return Internal("receive of an unknown tensor kind");
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::AddTied() {
  const int last_unit = NumUnits(setup_.train.model) - 1;
  if (setup_.first_unit == 0 && setup_.end_unit - 1 == last_unit) {
    // Both parts are here: embedding part + head part, as GptModel does.
    AddTiedGradient(TiedHolder(), FindParameter(*units_.back(), "wte.weight")->grad);
    return absl::OkStatus();
  }
  if (tied_received_.is_null()) return Internal("tied gradient not received");
  AddTiedGradient(TiedHolder(), tied_received_);
  return absl::OkStatus();
}

}  // namespace pipetrain
