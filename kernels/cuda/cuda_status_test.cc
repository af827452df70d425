// Status conversion runs without a GPU: the error names and strings are
// table lookups in the CUDA runtime and cuBLAS.
#include "kernels/cuda/cuda_status.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(CudaStatusTest, CudaStatus_Success_Ok) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaFree(p)", "x.cc", 1).ok());
}

TEST(CudaStatusTest, CudaStatus_Error_InternalNamingCallPlaceAndError) {
  const absl::Status status =
      CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "kernels/cuda/x.cc", 42);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("cudaMalloc(&p, n) failed at kernels/cuda/x.cc:42: "
                                  "cudaErrorMemoryAllocation"),
            std::string::npos)
      << status;
}

TEST(CudaStatusTest, CublasStatus_Success_Ok) {
  EXPECT_TRUE(CublasStatus(CUBLAS_STATUS_SUCCESS, "cublasSgemm(...)", "x.cc", 1).ok());
}

TEST(CudaStatusTest, CublasStatus_Error_InternalNamingCallPlaceAndStatus) {
  const absl::Status status =
      CublasStatus(CUBLAS_STATUS_INVALID_VALUE, "cublasSgemm(h)", "kernels/cuda/y.cc", 7);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("cublasSgemm(h) failed at kernels/cuda/y.cc:7: "
                                  "CUBLAS_STATUS_INVALID_VALUE"),
            std::string::npos)
      << status;
}

// cuBLASLt's "no algorithm for this configuration": a caller may fall back.
TEST(CudaStatusTest, CublasStatus_NotSupported_IsUnimplemented) {
  const absl::Status status = CublasStatus(CUBLAS_STATUS_NOT_SUPPORTED,
                                           "cublasLtMatmulAlgoGetHeuristic(h)", "linear.cc", 9);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << status;
}

absl::Status ReturnsThroughMacro(cudaError_t error) {
  CUDA_RETURN_IF_ERROR(error);
  return absl::OkStatus();
}

TEST(CudaStatusTest, CudaReturnIfError_Error_ReturnsInternalWithExpression) {
  const absl::Status status = ReturnsThroughMacro(cudaErrorInvalidValue);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("error failed at"), std::string::npos) << status;
  EXPECT_NE(status.message().find("cudaErrorInvalidValue"), std::string::npos) << status;
  EXPECT_TRUE(ReturnsThroughMacro(cudaSuccess).ok());
}

}  // namespace
}  // namespace pipetrain
