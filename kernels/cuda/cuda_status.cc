#include "kernels/cuda/cuda_status.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                          cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

absl::Status CublasStatus(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message =
      absl::StrCat(call, " failed at ", file, ":", line, ": ", cublasGetStatusName(status), " (",
                   cublasGetStatusString(status), ")");
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return absl::UnimplementedError(std::move(message));
  return absl::InternalError(std::move(message));
}

absl::Status CheckLaunch(const char* kernel, const char* file, int line) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("launch of ", kernel, " failed at ", file, ":", line,
                                          ": ", cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

}  // namespace pipetrain
