// 1-D (Megatron-style) tensor parallelism inside a unit (acctfm.txt §3.2,
// Fig. 1; DESIGN.md §12): what a tensor-parallel unit needs besides its
// backend.
//
// A group of T ranks runs the same unit on the same inputs; each rank holds
// a shard of the unit's large matrices and all of its small parameters
// (LayerNorm, the row-parallel layers' biases, wpe), which stay replicated:
// every rank computes bitwise the same gradient for them, because every
// value the ranks share comes out of an all-reduce that gives every rank
// the same bits (TensorParallelComm's contract).
//
//   attention  c_attn by output columns, heads [r H/T, (r+1) H/T) on rank r
//              (q, k and v each cut the same way); c_proj by input rows; one
//              all-reduce of the output in forward, one of dL/d(ln_1 out)
//              in backward.
//   mlp        c_fc by output columns, c_proj by input rows; the same two
//              all-reduces.
//   embed      wte by vocabulary rows; the partial embeddings are summed
//              (exact: kernels/cpu/vocab_parallel.h).
//   head       the tied wte by vocabulary rows; cross-entropy over the split
//              vocabulary without gathering the logits (two all-reduces
//              of per-row values in forward: the maxima, then the exp sums
//              and target logits packed; one of dL/d(ln_f out) in
//              backward).
// The row-parallel layers add their bias on rank 0 only, before the sum.
//
// Weights: a shard's initial values are cut from the unsplit parameter's
// (InitializeParameters makes the full tensor from (seed, name) and keeps
// this rank's part), so a tensor-parallel model starts as train-local's.
// GatherShards reassembles the unsplit Hugging Face tensor for export.
#ifndef PIPETRAIN_WORKER_MODEL_TENSOR_PARALLEL_H_
#define PIPETRAIN_WORKER_MODEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"
#include "worker/cube/cube_comm.h"
#include "worker/cube/cube_layout.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

// The tensor-parallel group a unit's ranks form, seen from one rank.
class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  virtual int rank() const = 0;  // 0 <= rank() < size()
  virtual int size() const = 0;
  // data <- the sum over the ranks of each rank's `data` (the same shape on
  // every rank, a tensor of the unit's backend), bitwise the same on every
  // rank. Every rank calls the same all-reduces with the same sizes in the
  // same order. Errors stick, as a Backend's do: the first failure is kept
  // in status(), `data` is then unspecified and later calls do nothing; the
  // driver of the units checks status() after each step.
  virtual void AllReduceSum(Tensor& data) = 0;
  virtual absl::Status status() const = 0;

  // The same all-reduce, overlapped with the caller's next work (AccTFM's
  // fine-grained pipeline, acctfm.txt §4.2): Start queues the sum of `data`
  // (which the caller must leave alone until the Wait) and returns a
  // ticket; Wait(ticket) blocks until `data` holds the sum. All-reduces run
  // one at a time in Start order, AllReduceSum's included (it waits for
  // those started before it). Every ticket must be waited for, in any
  // order, before the step ends. Default: the sum runs inside Start.
  virtual int StartAllReduceSum(Tensor& data) {
    AllReduceSum(data);
    return 0;
  }
  virtual void WaitAllReduce(int /*ticket*/) {}

  // AccTFM's hybrid compression (acctfm.txt §4.3; the job's
  // spec.parallelism.tensor_compression): whether this group sparsifies by
  // tokens and encodes the all-reduces of the row-parallel outputs and of
  // the inputs' gradients. Units compute token scores only when it does.
  virtual bool compresses() const { return false; }

  // Started like StartAllReduceSum; `data` holds rows of its last dimension
  // (rows = samples x seq_len, each row one token's values). Forward (§4.3.1): the
  // group sums `local_scores` (this rank's importance of each row, rows
  // values: an all-reduce of B x T numbers), every rank keeps in each
  // sample the same TopKCount(keep, seq_len) rows of highest summed score,
  // only those rows are all-reduced (encoded by the group's codec, §4.3.2)
  // and the other rows of `data` become 0. `*kept` (which must stay alive)
  // holds each row's kept flag (1 or 0) once WaitAllReduce(ticket) returns.
  // A group that does not compress() sums all rows and keeps them all.
  virtual int StartTokenSparseSum(Tensor& data, std::vector<float> /*local_scores*/,
                                  int /*seq_len*/, std::vector<uint8_t>* kept) {
    kept->assign(data.numel() == 0 ? 0 : static_cast<size_t>(data.numel() / data.shape().back()),
                 1);
    return StartAllReduceSum(data);
  }
  // The same sum over the rows `kept` names (one flag per row): the
  // backward pass reuses its forward's choice (§4.3.1, last paragraph). A
  // group that does not compress() sums all rows.
  virtual int StartMaskedSum(Tensor& data, std::vector<uint8_t> /*kept*/) {
    return StartAllReduceSum(data);
  }
};

// How a Parameter's value is cut from the unsplit tensor.
struct ParameterShard {
  enum class Split {
    kNone,     // the whole tensor (replicated when ranks > 1)
    kColumns,  // the last dimension: each of `column_blocks` equal blocks of
               // columns cut into `ranks` equal pieces, this rank's piece of
               // every block concatenated (c_attn's q, k, v: 3 blocks)
    kRows,     // the first dimension, in `ranks` equal pieces
    kCube,     // 3-D tensor parallelism: rank `rank` (CubeRankIndex) of a
               // p^3 cube holds the block worker/cube/cube_layout.h gives
               // `cube_operand` under `cube_direction` (a weight [N, K]
               // as [N / p, K / p^2]; a vector [L] as L / p^2 values on
               // the cube's diagonal, none elsewhere: a rank may hold an
               // empty tensor); with cube_attention_columns the columns
               // are c_attn's, permuted as worker/cube/cube_blocks.h says
  };
  Split split = Split::kNone;
  int rank = 0;
  int ranks = 1;  // kCube: p^3
  int column_blocks = 1;
  Shape full_shape;  // the unsplit tensor's; empty for kNone
  // kCube only.
  int cube_p = 0;
  CubeOperand cube_operand = CubeOperand::kWeight;
  CubeDirection cube_direction;
  bool cube_attention_columns = false;

  bool sharded() const { return split != Split::kNone; }
  // Whether this copy's squares belong in a global gradient norm: every
  // shard, and a replicated tensor on rank 0 only (counted once per group).
  bool CountsTowardNorm() const { return sharded() || rank == 0; }
};

// AccTFM's hybrid compression of a group's all-reduces (acctfm.txt §4.3):
// token-level top-k keeping `keep` of each sample's tokens, the kept rows
// encoded by `codec` (null: fp32). keep 1 and no codec: none.
struct TensorParallelCompression {
  double keep = 1;
  std::unique_ptr<Codec> codec;
  bool enabled() const { return keep < 1 || codec != nullptr; }
};

// The spec of a tensor-parallel compression: "none", or a codec spec
// (kernels/compress/codec_spec.h) of token_topk (with or without an inner
// codec), piecewise, linear, fp16 or bf16. INVALID_ARGUMENT naming
// `field` for any other.
absl::StatusOr<TensorParallelCompression> MakeTensorParallelCompression(const std::string& spec,
                                                                        const std::string& field);

// INVALID_ARGUMENT naming the field unless T >= 1 splits `config` evenly:
// T divides n_head (heads per rank), d_model, 4 d_model and vocab_size.
// A vocabulary T does not divide is told the padded size that would do,
// unless that is above max_vocab_size (> 0: the largest a spec accepts).
absl::Status ValidateTensorParallel(const GptConfig& config, int tensor_parallel,
                                    int64_t max_vocab_size = 0);

// INVALID_ARGUMENT naming the field unless a p x p x p cube (p >= 2) of
// 3-D tensor parallelism (spec.parallelism.tensor_mode 3d,
// worker/model/cube_units.h) splits `config` evenly: p divides n_head,
// p^2 divides d_model, p^3 the vocabulary (the embedding and the head stay
// 1-D, split by vocabulary over the p^3 ranks), and p^2 the samples of a
// micro-batch (`micro_batch_samples`; each rank's rows are whole
// sequences, so attention stays local). `tensor_parallel` is T = p^3; a T
// that is not a cube of p >= 2 is refused too.
absl::Status ValidateCubeTensorParallel(const GptConfig& config, int tensor_parallel,
                                        int64_t micro_batch_samples);
// p for T = p^3, or 0 when T is not the cube of an integer >= 2.
int CubeEdge(int tensor_parallel);

// The shape of this rank's part of a sharded() tensor.
Shape ShardShape(const ParameterShard& shard);

// This rank's part of host tensor `full` (shape shard.full_shape), as a new
// host tensor. Requires a valid shard of `full` (CHECK: programming error).
Tensor SliceShard(const Tensor& full, const ParameterShard& shard);

// The unsplit tensor from every rank's part: parts[r] is rank r's host
// tensor, all cut by `shard` with rank r. INVALID_ARGUMENT when the parts
// are not ranks' many or a part has the wrong element count (kCube parts
// differ in size: ShardShape of the shard with rank r).
absl::StatusOr<Tensor> GatherShards(const std::vector<Tensor>& parts, const ParameterShard& shard);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_TENSOR_PARALLEL_H_
