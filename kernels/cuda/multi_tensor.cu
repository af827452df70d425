#include <algorithm>
#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/multi_tensor.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

// Tensors per launch: their pointers and counts travel in the kernel's
// arguments (capped at 4 KiB), as AdamW's do.
constexpr int kTensorsPerLaunch = 64;

template <typename Pointer>
struct TensorBatch {
  Pointer data[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
  int blocks[kTensorsPerLaunch];  // SquaresBlocks(n), computed on the host
};
static_assert(sizeof(TensorBatch<float*>) + 64 <= 4096, "kernel arguments are capped at 4 KiB");

static_assert(kMaxSquaresBlocks <= kSquaresThreads,
              "the second pass gives each thread at most one partial");
static_assert((kSquaresThreads & (kSquaresThreads - 1)) == 0, "the trees halve the block");

// The sum of v over the block's kSquaresThreads threads by a halving tree
// in shared memory (a fixed order), returned to thread 0. All threads call
// it.
__device__ double BlockSum(double v, double* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int width = kSquaresThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  return partial[0];
}

// Pass 1. Grid (blocks, tensors of the batch): block b of tensor t sums the
// squares of elements b * threads + thread, stepping by SquaresBlocks(n) *
// threads, into partials[(first + t) * kMaxSquaresBlocks + b]. Blocks past
// the tensor's own count have nothing to do.
__global__ void SquaresPartialsKernel(TensorBatch<const float*> batch, int first,
                                      double* partials) {
  __shared__ double partial[kSquaresThreads];
  const int t = blockIdx.y;
  const int64_t n = batch.n[t];
  const int blocks = batch.blocks[t];
  if (static_cast<int>(blockIdx.x) >= blocks) return;  // the whole block: no barrier is skipped
  const float* x = batch.data[t];
  const int64_t stride = int64_t{blocks} * kSquaresThreads;
  double sum = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kSquaresThreads + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    sum += v * v;
  }
  sum = BlockSum(sum, partial);
  if (threadIdx.x == 0) partials[int64_t{first + t} * kMaxSquaresBlocks + blockIdx.x] = sum;
}

// Pass 2. One block per tensor of the batch: its SquaresBlocks(n) partials
// by the same tree, into sums[first + t].
__global__ void SquaresTotalsKernel(TensorBatch<const float*> batch, int first,
                                    const double* partials, double* sums) {
  __shared__ double partial[kSquaresThreads];
  const int t = blockIdx.x;
  const int blocks = batch.blocks[t];
  const double v = static_cast<int>(threadIdx.x) < blocks
                       ? partials[int64_t{first + t} * kMaxSquaresBlocks + threadIdx.x]
                       : 0.0;
  const double total = BlockSum(v, partial);
  if (threadIdx.x == 0) sums[first + t] = total;
}

// x = op(x) for each element. Grid (blocks, tensors of the batch), grid
// stride over each tensor.
template <typename Op>
__global__ void ElementwiseKernel(TensorBatch<float*> batch, Op op) {
  const int t = blockIdx.y;
  float* x = batch.data[t];
  const int64_t n = batch.n[t];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = op(x[i]);
  }
}

struct ScaleOp {
  float scale;
  __device__ float operator()(float v) const { return __fmul_rn(v, scale); }
};

struct ZeroOp {  // the element is not read: the load is dead code
  __device__ float operator()(float) const { return 0.0f; }
};

template <typename Pointer>
absl::Status CheckTensors(const char* op, Pointer const* tensors, const int64_t* counts,
                          int count) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": ", count, " tensors"));
  if (count > 0 && (tensors == nullptr || counts == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null tensor table"));
  }
  for (int i = 0; i < count; ++i) {
    if (counts[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " of ", count, " has ", counts[i], " elements"));
    }
    if (counts[i] > 0 && tensors[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " of ", count, " is null"));
    }
  }
  return absl::OkStatus();
}

// The tensors [first, first + kTensorsPerLaunch) of the table as a batch;
// *largest gets the largest count among them.
template <typename Pointer>
int FillBatch(Pointer const* tensors, const int64_t* counts, int count, int first,
              TensorBatch<Pointer>* batch, int64_t* largest) {
  const int in_batch = std::min(kTensorsPerLaunch, count - first);
  *largest = 0;
  for (int k = 0; k < in_batch; ++k) {
    batch->data[k] = tensors[first + k];
    batch->n[k] = counts[first + k];
    batch->blocks[k] = SquaresBlocks(counts[first + k]);
    *largest = std::max(*largest, counts[first + k]);
  }
  return in_batch;
}

// ElementwiseKernel(batch, op) for each batch of up to kTensorsPerLaunch
// tensors that has elements, on grid (blocks for its largest tensor, its
// tensors).
template <typename Op>
absl::Status LaunchPerBatch(const char* name, Op op, float* const* tensors, const int64_t* counts,
                            int count, cudaStream_t stream) {
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    TensorBatch<float*> batch{};
    int64_t largest = 0;
    const int in_batch = FillBatch(tensors, counts, count, first, &batch, &largest);
    if (largest == 0) continue;
    ElementwiseKernel<<<dim3(ElementwiseBlocks(largest), in_batch), kElementwiseThreads, 0,
                        stream>>>(batch, op);
    CUDA_CHECK_LAUNCH(name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SumsOfSquaresCuda(const float* const* tensors, const int64_t* counts, int count,
                               double* sums, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTensors("SumsOfSquaresCuda", tensors, counts, count));
  if (count == 0) return absl::OkStatus();
  if (sums == nullptr) return absl::InvalidArgumentError("SumsOfSquaresCuda: sums is null");
  ASSIGN_OR_RETURN(StreamScratch partials,
                   StreamScratch::Create(
                       static_cast<size_t>(count) * kMaxSquaresBlocks * sizeof(double), stream));
  for (int first = 0; first < count; first += kTensorsPerLaunch) {
    TensorBatch<const float*> batch{};
    int64_t largest = 0;
    const int in_batch = FillBatch(tensors, counts, count, first, &batch, &largest);
    SquaresPartialsKernel<<<dim3(SquaresBlocks(largest), in_batch), kSquaresThreads, 0, stream>>>(
        batch, first, partials.as<double>());
    CUDA_CHECK_LAUNCH("SquaresPartialsKernel");
    SquaresTotalsKernel<<<in_batch, kSquaresThreads, 0, stream>>>(batch, first,
                                                                  partials.as<double>(), sums);
    CUDA_CHECK_LAUNCH("SquaresTotalsKernel");
  }
  return absl::OkStatus();
}

absl::Status ScaleAllCuda(float* const* tensors, const int64_t* counts, int count, float scale,
                          cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTensors("ScaleAllCuda", tensors, counts, count));
  return LaunchPerBatch("ElementwiseKernel<ScaleOp>", ScaleOp{scale}, tensors, counts, count,
                        stream);
}

absl::Status ZeroAllCuda(float* const* tensors, const int64_t* counts, int count,
                         cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTensors("ZeroAllCuda", tensors, counts, count));
  return LaunchPerBatch("ElementwiseKernel<ZeroOp>", ZeroOp{}, tensors, counts, count, stream);
}

}  // namespace pipetrain
