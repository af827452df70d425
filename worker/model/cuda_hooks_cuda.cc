// cuda_hooks for a binary built with --config=cuda.
#include "kernels/cuda/device.h"
#include "worker/model/cuda_backend.h"
#include "worker/model/cuda_hooks.h"

namespace pipetrain {
namespace cuda_hooks {

bool Available() { return true; }

absl::StatusOr<int> DeviceCount() { return CudaDeviceCount(); }

absl::StatusOr<std::unique_ptr<Backend>> Create(int device, bool tf32) {
  return CreateCudaBackend(device, tf32 ? GemmMode::kTf32 : GemmMode::kFp32);
}

}  // namespace cuda_hooks
}  // namespace pipetrain
