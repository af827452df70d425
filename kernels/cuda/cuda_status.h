// CUDA and cuBLAS results as absl::Status, and the macros that check them.
//
// Every CUDA runtime and cuBLAS call in kernels/cuda goes through one of
// these, and every kernel launch is followed by CUDA_CHECK_LAUNCH: a launch
// with a bad configuration fails silently otherwise, and the error surfaces
// at some unrelated later call.
//
//   CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
//   MyKernel<<<blocks, threads, 0, stream>>>(...);
//   CUDA_CHECK_LAUNCH("MyKernel");
//
// The macros return from the enclosing function, which must return
// absl::Status (or absl::StatusOr<T>). All functions are thread-safe.
#ifndef PIPETRAIN_KERNELS_CUDA_CUDA_STATUS_H_
#define PIPETRAIN_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace pipetrain {

// OK for cudaSuccess; otherwise INTERNAL with `call` (the expression),
// file:line, the error's name and cudaGetErrorString, e.g.
// "cudaMalloc(&p, 64) failed at kernels/cuda/x.cc:12: cudaErrorMemoryAllocation
// (out of memory)". It does not clear the CUDA error state.
absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line);

// OK for CUBLAS_STATUS_SUCCESS; otherwise INTERNAL naming the call, file:line
// and the cuBLAS status name and description; UNIMPLEMENTED (same message)
// for CUBLAS_STATUS_NOT_SUPPORTED, which cuBLASLt's heuristic and matmul
// return for a configuration they have no algorithm for: a caller with
// another way to compute the product (linear.cc's bias epilogue) falls back
// on it.
absl::Status CublasStatus(cublasStatus_t status, const char* call, const char* file, int line);

// Checks the kernel launch just made on this host thread: cudaGetLastError()
// (which also clears a non-sticky launch error). OK, or INTERNAL naming
// `kernel` and file:line. It does not wait for the kernel to finish, so
// faults during execution surface at the next synchronising call.
absl::Status CheckLaunch(const char* kernel, const char* file, int line);

}  // namespace pipetrain

#define PT_CUDA_RETURN_IF_ERROR_STATUS_(status_expr)      \
  do {                                                    \
    ::absl::Status pt_cuda_status_ = (status_expr);       \
    if (!pt_cuda_status_.ok()) return pt_cuda_status_;    \
  } while (0)

// Evaluates a cudaError_t expression once; returns its INTERNAL status on failure.
#define CUDA_RETURN_IF_ERROR(call) \
  PT_CUDA_RETURN_IF_ERROR_STATUS_(::pipetrain::CudaStatus((call), #call, __FILE__, __LINE__))

// Evaluates a cublasStatus_t expression once; returns its INTERNAL status on failure.
#define CUBLAS_RETURN_IF_ERROR(call) \
  PT_CUDA_RETURN_IF_ERROR_STATUS_(::pipetrain::CublasStatus((call), #call, __FILE__, __LINE__))

// After `kernel<<<...>>>(...)`: returns INTERNAL if the launch failed.
#define CUDA_CHECK_LAUNCH(kernel_name) \
  PT_CUDA_RETURN_IF_ERROR_STATUS_(::pipetrain::CheckLaunch((kernel_name), __FILE__, __LINE__))

#endif  // PIPETRAIN_KERNELS_CUDA_CUDA_STATUS_H_
