// A partitionable piece of the GPT-2 model (see gpt_config.h for the list).
//
// Units are pure compute over explicit state: parameters (value + gradient)
// live in the unit; everything the backward pass needs from the forward pass
// lives in a UnitContext owned by the caller. That split is what pipeline
// execution needs: a stage keeps one context per micro-batch in flight (the
// stash), or drops it and rebuilds it with Recompute on another worker.
//
// Backends: a unit's parameters, contexts, inputs and outputs live on its
// Backend's device and its ops run there (backend.h); MakeUnit's default is
// the CPU backend. The head's loss is a [1] tensor on its backend's device
// (a device backend does not wait for it; read it with LossValue), or on
// the host (the CPU backend, a split vocabulary); dL/dloss is a host [1]
// tensor.
//
// Not thread-safe: one thread drives a unit at a time.
#ifndef PIPETRAIN_WORKER_MODEL_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_UNIT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "worker/data/dataset.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/gpt_config.h"
#include "worker/model/tensor_parallel.h"

namespace pipetrain {

enum class ParamInit { kZeros, kOnes, kNormal };

struct Parameter {
  std::string name;  // Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight"
  Tensor value;
  Tensor grad;  // same shape; backward passes ACCUMULATE into it
  ParamInit init = ParamInit::kZeros;
  float init_std = 0.0f;  // for kNormal
  // 2-D weight matrices (and the embeddings); weight decay applies to these
  // under the default "matrices only" policy.
  bool is_matrix = false;
  // Tensor parallelism: how `value` is cut from the unsplit tensor `name`
  // (kNone, ranks 1 outside a tensor-parallel group).
  ParameterShard shard;
};

// Saved tensors of one forward pass, in a unit-specific slot order.
struct UnitContext {
  std::vector<Tensor> saved;
  void Clear() { saved.clear(); }
  int64_t bytes() const;
};

class Unit {
 public:
  virtual ~Unit() = default;

  const std::string& name() const { return name_; }
  UnitKind kind() const { return kind_; }
  // Where this unit's tensors live and its ops run (never null).
  Backend* backend() const { return backend_; }
  // The tensor-parallel group this unit is a shard of; null when whole.
  TensorParallelComm* tensor_parallel() const { return tp_; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  // AccTFM's fine-grained pipeline (acctfm.txt §4.2): a tensor-parallel
  // attention or MLP unit splits each micro-batch along its samples into
  // `forward` partitions in its forward pass and `backward` in its backward
  // pass, each >= 1, and all-reduces partition j while it computes partition
  // j + 1. A count that does not divide the micro-batch's samples is cut to
  // their greatest common divisor; without a group of two ranks or more
  // (or in other units) it does nothing. Default 1 and 1.
  void set_tensor_parallel_partitions(int forward, int backward);
  // AccTFM's pipeline across units (acctfm.txt §4.2, Fig. 6: partition j
  // of layer i + 1 starts once partition j of layer i is reduced). A unit
  // that streams_tensor_parallel() and is told set_stream_output(true)
  // before a Forward or Backward returns its output (the forward's y, the
  // backward's dx) without waiting for its partitions' all-reduces: the
  // rows of each partition are pending until their all-reduce is waited
  // for and finished (the forward adds the residual, the backward runs the
  // LayerNorm's backward, which also adds to its gradients, and the
  // residual). PassPendingTo(next) hands them to the unit that reads that
  // output next, which resolves each partition's rows as it first reads
  // them (its partitions may be cut differently: the paper's SplitOrMerge)
  // and all of them before it returns. Until then the output tensor must
  // not be read elsewhere, and in backward this unit's LayerNorm
  // gradients are not final. The flag applies to the next call only.
  virtual bool streams_tensor_parallel() const { return false; }
  void set_stream_output(bool stream) { stream_output_ = stream; }
  void PassPendingTo(Unit* next);

  // Parameters in a fixed order; pointers stay valid for the unit's life.
  std::vector<Parameter*> parameters();
  void ZeroGrads();

  // Forward pass on a micro-batch. x is [B, T, d_model] (embed ignores x and
  // reads batch.inputs). Returns [B, T, d_model]; head returns the mean
  // cross-entropy over the B*T positions as a [1] tensor, reading
  // batch.targets. Overwrites *ctx with what Backward needs.
  virtual Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) = 0;

  // Backward pass given dy = dL/dy for Forward's output, shaped as it (for
  // head: a [1] tensor holding dL/dloss, e.g. 1/micro_batches; attention
  // and MLP units slice it by samples). Accumulates parameter
  // gradients and returns dL/dx [B, T, d_model] (embed returns a null
  // tensor). ctx must come from Forward or Recompute on the same x and batch.
  virtual Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) = 0;

  // Token importance for token-level top-k compression of this unit's
  // output (acctfm §4.3.1), one score per token in [B, T] order, from the
  // context Forward just wrote; empty when the unit has none (then the
  // codec ranks tokens by L2 norm). AttentionUnit: the column sums An of
  // the attention matrix, summed over heads; with tensor parallelism (1-D,
  // or the cube's CubeBlockUnit) over all the group's heads and samples, a
  // collective every rank calls for the same unit and micro-batch (so all
  // ranks keep the same tokens).
  virtual std::vector<float> TokenImportance(const UnitContext& ctx) const { return {}; }

  // Asks every later Forward to keep what TokenImportance reads
  // (AttentionUnit: the attention probabilities, which a flash-style
  // backend otherwise does not keep; TokenImportance returns {} for a
  // context made without them). Call before the unit's first Forward.
  virtual void KeepTokenImportance() {}

  // Rebuilds ctx from x for a backward pass without a stash; bitwise the
  // same context as Forward produced.
  void Recompute(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) {
    Forward(x, batch, ctx);
  }

 protected:
  Unit(std::string name, UnitKind kind, Backend* backend, TensorParallelComm* tp = nullptr)
      : name_(std::move(name)), kind_(kind), backend_(backend), tp_(tp) {}
  // A parameter whose unsplit shape is `shape`. With a tensor-parallel
  // group of two ranks or more, `split` (and `column_blocks`, see
  // ParameterShard) says which part this rank holds, kNone a replica;
  // without one the whole tensor, whatever `split` says.
  Parameter* AddParameter(std::string name, const Shape& shape, ParamInit init, float init_std,
                          bool is_matrix,
                          ParameterShard::Split split = ParameterShard::Split::kNone,
                          int column_blocks = 1);
  // All-reduces `data` over the tensor-parallel group; nothing when whole.
  void TensorParallelSum(Tensor& data) {
    if (tp_ != nullptr) tp_->AllReduceSum(data);
  }
  // The partitions of a pass over `samples` samples (see
  // set_tensor_parallel_partitions).
  int TensorParallelPartitions(int samples, bool forward) const;
  // Starts the all-reduce of `data` (TensorParallelComm::StartAllReduceSum)
  // and remembers its ticket; WaitTensorParallelSums waits for all of them.
  void StartTensorParallelSum(Tensor& data) {
    if (tp_ != nullptr) tickets_.push_back({tp_->StartAllReduceSum(data), nullptr});
  }
  void WaitTensorParallelSums();

  // AccTFM's hybrid compression (acctfm.txt §4.3): whether the group
  // compresses its sums, and the two sparse sums of TensorParallelComm,
  // remembered like StartTensorParallelSum's (WaitTensorParallelSums).
  // Only with a group. The token-sparse sum of a pass's rows [row, row +
  // rows of data) writes their kept flags to the same rows of `mask` (the
  // pass's rows as a host tensor of 1 / 0, kept in the unit's context) once
  // it is waited for: by WaitTensorParallelSums, or, streamed, by the unit
  // that resolves those rows (so `mask` is complete once the pass's output
  // is). A failed sum leaves its rows 0 (the group's status() says why).
  bool TensorParallelCompresses() const { return tp_ != nullptr && tp_->compresses(); }
  void StartTensorParallelTokenSparseSum(Tensor& data, std::vector<float> local_scores, int seq_len,
                                         Tensor mask, int64_t row);
  void StartTensorParallelMaskedSum(Tensor& data, std::vector<uint8_t> kept) {
    tickets_.push_back({tp_->StartMaskedSum(data, std::move(kept)), nullptr});
  }
  // The kept flags of rows [begin, end) of a pass from its `mask`.
  static std::vector<uint8_t> KeptRows(const Tensor& mask, int64_t begin, int64_t end);
  // A copy of backend tensor `x` (rows of its last dimension) whose rows
  // not kept are 0: a dropped token's output was 0 in forward, so its
  // gradient must not reach the weights (acctfm.txt §4.3.1).
  Tensor ZeroDroppedRows(const Tensor& x, const std::vector<uint8_t>& kept) const;
  // Each row's squared L2 norm (rows of the last dimension; host copy when
  // on a device), a finite one capped at FLT_MAX / (2 * the group's size)
  // so the ranks' float sum of scores stays finite (NaN and Inf kept).
  std::vector<float> RowSquaredNorms(const Tensor& x) const;

  // Streaming (see set_stream_output). Whether this call streams (and
  // clears the flag for the next one): only with a group of two ranks or
  // more, compressing or not.
  bool TakeStreamOutput();
  // Registers rows [begin, end) of this call's output as pending on the
  // last sum started (StartTensorParallelSum or a sparse one), finished by
  // `finish` once it is waited for (after what the sum itself does then,
  // such as writing its kept flags); the caller then returns without
  // WaitTensorParallelSums (the tickets move to the pending rows).
  void AddPendingOutputRows(int64_t begin, int64_t end, std::function<void()> finish);
  // The two kinds of pending rows the residual blocks (attention, MLP)
  // stream, on the last all-reduce started, rows [row, row + rows) of
  // `width` values: forward, y's rows += x's once summed (the residual);
  // backward, once dln's rows are summed, the LayerNorm's backward over
  // them into dx (adding to ln_w's and ln_b's gradients; mean and rstd of
  // its forward on x) and dx += dy (the residual path). The tensors are
  // kept alive by the pending rows.
  void AddPendingResidualRows(Tensor x, Tensor y, int64_t row, int64_t rows, int64_t width);
  void AddPendingLayerNormBackwardRows(Tensor x, Tensor mean, Tensor rstd, Tensor dln, Tensor dx,
                                       Tensor dy, Parameter* ln_w, Parameter* ln_b, int64_t row,
                                       int64_t rows, int64_t width);
  // Waits for and finishes the handed-over input rows that overlap
  // [begin, end), in the order they were registered; ResolveAllInput all.
  void ResolveInputRows(int64_t begin, int64_t end);
  void ResolveAllInput() { ResolveInputRows(0, INT64_MAX); }

 private:
  std::string name_;
  UnitKind kind_;
  Backend* backend_;
  TensorParallelComm* tp_;
  int partitions_forward_ = 1, partitions_backward_ = 1;
  // A sum started and not yet waited for, and what to do once it is
  // (empty: nothing).
  struct Ticket {
    int id = 0;
    std::function<void()> on_done;
  };
  std::vector<Ticket> tickets_;
  bool stream_output_ = false;
  struct PendingRows {
    int64_t begin = 0, end = 0;
    int ticket = 0;
    TensorParallelComm* comm = nullptr;
    std::function<void()> finish;
    bool done = false;
  };
  std::vector<PendingRows> pending_out_;  // this call's output's
  std::vector<PendingRows> pending_in_;   // handed over by the producer
  std::vector<std::unique_ptr<Parameter>> params_;
};

// The parameter of `unit` named `name`, or nullptr.
Parameter* FindParameter(Unit& unit, const std::string& name);

// Ties a head unit's copy of wte.weight to the embedding unit's value
// buffer (gradients stay separate) and returns the head's copy. Used when
// one process owns both ends of the model.
Parameter* TieHeadToEmbedding(Unit& embed, Unit& head);

// The tied-embedding rule (DESIGN.md §3): wte's gradient is the sum of the
// embedding's part and the head's part. `holder` is the wte Parameter whose
// gradient holds this side's part; `other_part` the other side's. Both sides
// of a pipeline call this with the roles swapped; IEEE addition of two terms
// is commutative, so both copies get bitwise the same gradient. Both
// tensors are on `backend`'s device; their sizes must match (CHECK).
void AddTiedGradient(Backend* backend, Parameter* holder, const Tensor& other_part);

// Builds unit `index` of `config` with zeroed parameters on `backend`
// (config must be valid; backend not null and outliving the unit). Call
// InitializeParameters to fill them.
//
// With `tp` (not null; it must outlive the unit), the unit is rank
// tp->rank() of a tensor-parallel group (tensor_parallel.h); requires
// ValidateTensorParallel(config, tp->size()) to pass (CHECK).
std::unique_ptr<Unit> MakeUnit(const GptConfig& config, int index, Backend* backend = CpuBackend(),
                               TensorParallelComm* tp = nullptr);

// Deterministic initialisation: each parameter's values are a pure function
// of (seed, parameter name) via Philox, so any worker that builds a unit
// gets identical weights. Normal weights use std 0.02; the two residual
// projections of each block (attn.c_proj, mlp.c_proj) use 0.02/sqrt(2L) as
// in GPT-2; LayerNorm gains are 1; biases 0. Gradients are zeroed. Values
// are made on the host and uploaded, so every backend starts bitwise equal.
// A tensor-parallel shard gets its part of the unsplit tensor's values.
void InitializeParameters(Unit* unit, uint64_t seed);

// The value of a head's loss tensor (Unit contract above): downloaded from
// the backend's device (a device backend waits for the work queued before
// it), or read on the host.
inline float LossValue(Backend* backend, const Tensor& loss) {
  return loss.on_device() ? backend->Download(loss)[0] : loss[0];
}

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_UNIT_H_
