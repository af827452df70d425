// 3-D tensor parallelism inside a stage (3d-parallelism.txt; the job's
// spec.parallelism.tensor_mode 3d; DESIGN.md §12): the attention and MLP
// units of a stage whose T = p^3 tensor ranks form a p x p x p cube. The
// numerics are worker/cube/cube_blocks.h's (the 3-D linear layers, the 3-D
// LayerNorm, local attention on whole samples); this file makes them Units
// that a StageRuntime drives like any other.
//
// Activations. Between a cube unit and anything else (the embedding, the
// head, another stage) an activation or its gradient is the full
// [B, T, d] tensor, replicated bitwise on every rank, as in 1-D tensor
// parallelism. Between two cube units of the same stage it stays this
// rank's block [B / p^2, T, d / p] of the activation layout (cube_layout.h,
// direction CubeDirection{}): set_output_full(false) on the first of the
// two. A unit reads which one it got from the last dimension (d or d / p;
// they differ since p >= 2): a full input is cut to the block (no
// communication, every rank holds it), and its gradient is all-gathered
// back to the full tensor over the cube (three all-gathers, one per
// axis); a full output is all-gathered the same way and its gradient cut.
//
// Parameters keep their Hugging Face names; each rank holds its cube block
// (ParameterShard::Split::kCube: weights [N / p, K / p^2], vectors on the
// cube's diagonal, empty tensors elsewhere), initialised as the unsplit
// model's (InitializeParameters cuts the full tensor) and gathered back by
// GatherShards.
//
// The embedding and the head stay 1-D: vocabulary-parallel over the same
// p^3 ranks (tensor_parallel.h), through a TensorParallelComm whose rank r
// is cube rank r (CubeRankIndex).
//
// Errors: the Unit interface returns tensors, so a failed collective sticks
// in the CubeUnitGroup (status()); the units then skip all communication
// and return zeros of the right shape. The driver checks status() after
// each step, as it checks TensorParallelComm::status(). CPU backend only:
// the cube library works on host memory.
#ifndef PIPETRAIN_WORKER_MODEL_CUBE_UNITS_H_
#define PIPETRAIN_WORKER_MODEL_CUBE_UNITS_H_

#include <memory>

#include "absl/status/status.h"
#include "worker/cube/cube_blocks.h"
#include "worker/cube/cube_comm.h"
#include "worker/model/unit.h"

namespace pipetrain {

// A stage's cube as its units see it: the comm (which must outlive this)
// and the first error they met.
class CubeUnitGroup {
 public:
  explicit CubeUnitGroup(CubeComm* comm) : comm_(comm) {}
  CubeComm& comm() { return *comm_; }
  int p() const { return comm_->p(); }
  absl::Status status() const { return status_; }
  // Keeps the first error; OK statuses are ignored.
  void Record(const absl::Status& status) {
    if (status_.ok() && !status.ok()) status_ = status;
  }

 private:
  CubeComm* comm_;
  absl::Status status_;
};

// Unit "attn_i" or "mlp_i" (UnitKindAt(config, index)) as this rank's part
// of a cube.
class CubeBlockUnit : public Unit {
 public:
  // Requires an attention or MLP index, the CPU backend and a config the
  // cube splits (ValidateCubeTensorParallel with any batch): CHECK.
  CubeBlockUnit(const GptConfig& config, int index, Backend* backend, CubeUnitGroup* group);

  // Whether Forward returns the full activation (the default) or this
  // rank's block, for a next unit that is a CubeBlockUnit of the same
  // stage and group (see above).
  void set_output_full(bool full) { output_full_ = full; }
  bool output_full() const { return output_full_; }

  // x and dy full or blocks (see above). A batch whose samples p^2 does not
  // divide (the last micro-batch of a validation pass) is padded with zero
  // samples to the next multiple, which every block then holds; they are
  // dropped from full outputs, and get zero gradients.
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;

  // Attention: the whole layer's An for the B x T tokens of the micro-batch
  // (AttentionUnit::TokenImportance's scores, within rounding), the same
  // bits on every rank of the cube, so token top-k keeps the same tokens
  // on all of them. Each rank holds the probabilities of B / p^2 samples
  // and n_head / p heads: it sums its heads' columns (AttentionColumnSums),
  // the p ranks holding the other heads of those samples add theirs (an
  // all-reduce), and two all-gathers collect the samples. A collective:
  // every rank calls it for the same unit and micro-batch. MLP: {} (the
  // codec ranks tokens by norm). Also {} once the group has failed.
  std::vector<float> TokenImportance(const UnitContext& ctx) const override;
  // The cube's attention always keeps its probabilities (its backward
  // reads them): nothing to ask.
  void KeepTokenImportance() override {}

 private:
  // CubeBlockContext's vectors, whether the input was full (a [1] tensor
  // holding 1 or 0), and the micro-batch's samples before padding (a [1]
  // tensor; exact, samples are below 2^24).
  enum Slot { kX, kLnOut, kMean, kRstd, kHidden, kAct, kProbs, kInputFull, kBatch, kNumSlots };

  // The six parameters' values, for the cube_blocks.h calls.
  CubeBlockParams Params();
  Parameter* AddCubeParameter(const std::string& name, const Shape& shape, ParamInit init,
                              float init_std, bool is_matrix, CubeOperand operand, bool swapped,
                              bool attention_columns);
  // `batch` rounded up to a multiple of p^2.
  int64_t PaddedBatch(int64_t batch) const;
  // This rank's block of full [B, T, d] activation `x` (padded), and the
  // full activation from every rank's `block` (all-gathers, padding
  // dropped; zeros after an error).
  Tensor CutBlock(const Tensor& x, int64_t batch, int64_t seq_len);
  Tensor GatherFull(const Tensor& block, int64_t batch, int64_t seq_len);

  GptConfig config_;
  CubeUnitGroup* group_;
  CubeDirection direction_;
  bool output_full_ = true;
  Parameter *ln_w_, *ln_b_, *in_w_, *in_b_, *out_w_, *out_b_;
};

// MakeUnit for a stage of 3-D tensor parallelism: attention and MLP units
// are CubeBlockUnits on `group`; the embedding and the head are the 1-D
// vocabulary-parallel units on `tp`, whose size is p^3. Requires the CPU
// backend and ValidateCubeTensorParallel (CHECK); both groups must outlive
// the unit.
std::unique_ptr<Unit> MakeCubeTensorParallelUnit(const GptConfig& config, int index,
                                                 Backend* backend, CubeUnitGroup* group,
                                                 TensorParallelComm* tp);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_CUBE_UNITS_H_
