// cuda_hooks for a binary built with --config=cuda.
#include "kernels/cuda/device.h"
#include "worker/model/cuda_backend.h"
#include "worker/model/cuda_hooks.h"

namespace pipetrain {
namespace cuda_hooks {

bool Available() { return true; }

absl::StatusOr<int> DeviceCount() { return CudaDeviceCount(); }

absl::StatusOr<std::unique_ptr<Backend>> Create(int device, const std::string& gemm,
                                                const std::string& attention) {
  const GemmMode mode = gemm == "tf32"   ? GemmMode::kTf32
                        : gemm == "bf16" ? GemmMode::kBf16
                                         : GemmMode::kFp32;
  return CreateCudaBackend(device, mode,
                           attention == "gemm"    ? AttentionImpl::kGemm
                           : attention == "flash" ? AttentionImpl::kFlash
                                                  : AttentionImpl::kReference);
}

}  // namespace cuda_hooks
}  // namespace pipetrain
