// What backend_select.cc needs from CUDA, with two implementations chosen by
// the build (worker/model/BUILD): cuda_hooks_cuda.cc under --config=cuda,
// cuda_hooks_none.cc otherwise. Internal to backend_select.
#ifndef PIPETRAIN_WORKER_MODEL_CUDA_HOOKS_H_
#define PIPETRAIN_WORKER_MODEL_CUDA_HOOKS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/backend.h"

namespace pipetrain {
namespace cuda_hooks {

// Whether the CUDA backend is compiled in.
bool Available();
// Visible CUDA devices; 0 without CUDA or without a device/driver.
absl::StatusOr<int> DeviceCount();
// CreateCudaBackend (cuda_backend.h) with the GEMM mode named "fp32",
// "tf32" or "bf16" and the attention named "reference", "gemm" or "flash"
// (both validated by the caller; "auto" resolved by it); FAILED_PRECONDITION without CUDA.
absl::StatusOr<std::unique_ptr<Backend>> Create(int device, const std::string& gemm,
                                                const std::string& attention);

}  // namespace cuda_hooks
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_CUDA_HOOKS_H_
