// Test helper: an attention unit then an MLP unit of 1-D tensor
// parallelism, each rank a thread with its own backend, the all-reduces on
// Collectives over an in-process fabric, compressing or not (AccTFM's
// hybrid compression), streamed across the two units (Unit::
// set_stream_output: the attention's sums resolved by the MLP's forward,
// the MLP's by the attention's backward) or each unit waiting for its own.
// Shared by the CPU and CUDA tests of tensor-parallel compression.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_CHAIN_TESTING_H_
#define PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_CHAIN_TESTING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "worker/data/dataset.h"
#include "worker/model/backend.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {
namespace testing {

// One rank's results, host copies.
struct TensorParallelChainRun {
  Tensor y, dx;                            // the MLP's output, the attention's input gradient
  std::vector<float> attn_kept, mlp_kept;  // compressing: each row's kept flag
  std::map<std::string, Tensor> grads;     // both units' parameters' gradients (shards)
  absl::Status status;                     // the rank's comm's, then its backend's
};

// The tests' model: one layer, 4 heads, vocabulary 64, sequences of 16,
// d_model `d_model` (4 heads and 2 ranks split it when it is a multiple
// of 8); and their batch: 4 samples of 16 tokens (inputs and targets 0,
// which the attention and MLP units do not read).
GptConfig TensorParallelChainConfig(int d_model);
TokenBatch TensorParallelChainBatch();

// attn_0 then mlp_0 of `config` (seed `seed`) on `ranks` ranks, rank r
// computing on backend_of(r) (a CUDA backend serves one thread, so each
// rank its own; the CPU backend may be shared),
// each unit in `partitions` AccTFM partitions both ways, the group
// compressing with `compression` ("none": exact); forward of x ([B, T,
// d_model], host) and backward of dy (host) once. Every rank's results.
std::vector<TensorParallelChainRun> RunTensorParallelChain(
    const GptConfig& config, uint64_t seed, int ranks, const std::string& compression,
    int partitions, bool stream, const Tensor& x, const Tensor& dy, const TokenBatch& batch,
    const std::function<Backend*(int rank)>& backend_of);

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_CHAIN_TESTING_H_
