// Passes over many tensors (a model's gradients) in few launches: each
// launch takes up to 64 tensors, their pointers in the kernel's arguments,
// as AdamWUpdateAllCuda (adamw.h) does.
//   SumsOfSquaresCuda  sums[i] = sum_j double(x_i[j])^2, for each tensor i
//   ScaleAllCuda       x_i[j] = x_i[j] * scale, for each tensor i
//   ZeroAllCuda        x_i[j] = +0, for each tensor i
// The first two are gradient clipping by the global norm
// (worker/train/grad_clip.h) without copying the gradients to the host
// (which cost a download of every gradient for the norm and a download and
// upload for the scaling: about 1.5 GB of PCIe traffic and a serial host
// loop per step for GPT-2 124M). The third zeroes the gradients before a
// step: one launch per 64 tensors instead of a cudaMemsetAsync each (149
// for GPT-2 124M, about 1 ms of a step on an H200, docs/benchmarks.md).
//
// The sums are in double, as the CPU's (grad_clip.h), but in a fixed tree
// rather than element order: tensor i's elements are split over
// SquaresBlocks(n_i) blocks by a grid stride, each block's squares are
// summed by a halving tree, and the block partials by a second halving
// tree. The order depends only on n_i, so a tensor's sum is bitwise the
// same run to run, on any GPU and in any batch of tensors; it differs from
// the CPU's element-order sum only in the last bits of the double.
// ScaleAllCuda's products are single IEEE multiplications, bitwise the
// host's x * scale.
//
// Pointers are device pointers: tensors[i] to counts[i] floats (null only
// when counts[i] == 0; tensors must not overlap); sums to `count` doubles. The tensor tables
// themselves are host arrays. Work is queued on `stream`; these return
// before it finishes (copy the sums to the host to read them). Scratch for
// the block partials comes from the stream's cache (stream_scratch.h),
// kMaxSquaresBlocks doubles per tensor. INVALID_ARGUMENT for count < 0, a
// negative count or a null tensor with elements (naming its index), all
// checked before anything is launched; RESOURCE_EXHAUSTED when the scratch
// does not fit; INTERNAL if a launch fails. count == 0 does nothing; a
// tensor of no elements sums to 0. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_H_
#define PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/multi_tensor_layout.h"

namespace pipetrain {

absl::Status SumsOfSquaresCuda(const float* const* tensors, const int64_t* counts, int count,
                               double* sums, cudaStream_t stream = nullptr);

absl::Status ScaleAllCuda(float* const* tensors, const int64_t* counts, int count, float scale,
                          cudaStream_t stream = nullptr);

absl::Status ZeroAllCuda(float* const* tensors, const int64_t* counts, int count,
                         cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_H_
