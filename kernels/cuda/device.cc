#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include <cstring>

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

std::string FormatGpuUuid(const unsigned char (&bytes)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int index) {
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index ", index, " is negative"));
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
  unsigned char uuid[16];
  static_assert(sizeof(prop.uuid.bytes) == sizeof(uuid), "cudaUUID_t is 16 bytes");
  std::memcpy(uuid, prop.uuid.bytes, sizeof(uuid));
  info.uuid = FormatGpuUuid(uuid);
  return info;
}

}  // namespace pipetrain
