#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  // Without libcuda.so the runtime reports an insufficient driver; with a
  // driver but no GPU, no device. Both mean "no GPU here". Clear the error so
  // later CheckLaunch calls do not report it.
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return 0;
  }
  RETURN_IF_ERROR(CudaStatus(error, "cudaGetDeviceCount(&count)", __FILE__, __LINE__));
  return count;
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int index) {
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device index ", index, " is negative"));
  }
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (index >= count) {
    return absl::NotFoundError(absl::StrCat("CUDA device ", index, " not found: ", count,
                                            " device(s) visible (check nvidia-smi and "
                                            "CUDA_VISIBLE_DEVICES)"));
  }
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));
  CudaDeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.sm_count = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  char bus_id[32] = {};  // "dddddddd:bb:dd.f" at most (CUDA asks for >= 13 bytes)
  CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index));
  info.pci_bus_id = bus_id;
  return info;
}

absl::Status CheckKernelsRunOn(const CudaDeviceInfo& device) {
  if (device.compute_major > kKernelsComputeMajor ||
      (device.compute_major == kKernelsComputeMajor &&
       device.compute_minor >= kKernelsComputeMinor)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA device ", device.index, " (", device.name, ") has compute capability ",
                   device.compute_major, ".", device.compute_minor, "; this build's kernels need ",
                   kKernelsComputeMajor, ".", kKernelsComputeMinor,
                   " or later (tools/cuda/cuda.bzl builds them for sm_", kKernelsComputeMajor,
                   kKernelsComputeMinor, "): use --device cpu, or build for this GPU"));
}

}  // namespace pipetrain
