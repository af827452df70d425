// Backend selection from flags. Runs in both builds: without CUDA (plain
// CI) and under --config=cuda; the expectations follow BuiltWithCuda() and
// the visible device count, so each build checks its own behaviour.
#include "worker/model/backend_select.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Sets CUDA_MODULE_LOADING=EAGER where the environment is silent and keeps
// what a user chose. Restores the variable.
TEST(BackendSelectTest, PreferEagerCudaModuleLoading_SetsOnlyWhenUnset) {
  const char* before = std::getenv("CUDA_MODULE_LOADING");
  const std::string saved = before == nullptr ? "" : before;
  unsetenv("CUDA_MODULE_LOADING");
  PreferEagerCudaModuleLoading();
  ASSERT_NE(std::getenv("CUDA_MODULE_LOADING"), nullptr);
  EXPECT_EQ(std::string(std::getenv("CUDA_MODULE_LOADING")), "EAGER");
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  PreferEagerCudaModuleLoading();
  EXPECT_EQ(std::string(std::getenv("CUDA_MODULE_LOADING")), "LAZY");
  if (before == nullptr) {
    unsetenv("CUDA_MODULE_LOADING");
  } else {
    setenv("CUDA_MODULE_LOADING", saved.c_str(), 1);
  }
}

TEST(BackendSelectTest, Cpu_IsTheCpuBackend) {
  absl::StatusOr<SelectedBackend> s = SelectBackend("cpu", "fp32");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend->kind(), BackendKind::kCpu);
  EXPECT_EQ(s->owned, nullptr);
}

TEST(BackendSelectTest, UnknownDevice_InvalidArgumentListingChoices) {
  for (const std::string bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", ""}) {
    absl::StatusOr<SelectedBackend> s = SelectBackend(bad, "fp32");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("auto, cpu, cuda or cuda:N"), std::string::npos)
        << s.status();
  }
}

TEST(BackendSelectTest, UnknownGemm_InvalidArgument) {
  absl::StatusOr<SelectedBackend> s = SelectBackend("cpu", "fp16");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("fp32, tf32 or bf16, got 'fp16'"), std::string::npos)
      << s.status();
}

TEST(BackendSelectTest, UnknownOrCpuGemmAttention_InvalidArgument) {
  absl::StatusOr<SelectedBackend> s = SelectBackend("cpu", "fp32", "fused");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("auto, reference, gemm or flash, got 'fused'"),
            std::string::npos)
      << s.status();
  for (const std::string attention : {"gemm", "flash"}) {
    s = SelectBackend("cpu", "fp32", attention);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("--attention " + attention + " needs a CUDA device"),
              std::string::npos)
        << s.status();
  }
  EXPECT_TRUE(ValidateDeviceFlags("cuda", "tf32", "gemm").ok());
  EXPECT_TRUE(ValidateDeviceFlags("cuda", "bf16", "flash").ok());
  EXPECT_TRUE(SelectBackend("cpu", "fp32", "reference").ok());
}

// auto, the default, is the CPU's one attention on the CPU (and gemm on
// CUDA, which needs a GPU to show: cuda_backend_test, scripts/gpu_run.sh).
TEST(BackendSelectTest, AutoAttention_DefaultAndAcceptedOnCpu) {
  EXPECT_TRUE(ValidateDeviceFlags("cpu", "fp32", "auto").ok());
  EXPECT_TRUE(ValidateDeviceFlags("cuda", "bf16", "auto").ok());
  for (const std::string device : {"cpu", "auto"}) {
    if (device == "auto" && BuiltWithCuda() && VisibleCudaDevices() > 0) continue;  // a GPU
    absl::StatusOr<SelectedBackend> s = SelectBackend(device, "fp32", "auto");
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->backend->kind(), BackendKind::kCpu);
  }
}

// A GPU-only mode with --device auto is a usage error where auto is the CPU
// (the worker exits 2 before any work), and fine where a GPU is visible.
TEST(BackendSelectTest, ValidateHere_AutoWithGpuOnlyModeNeedsAVisibleGpu) {
  const bool gpu = BuiltWithCuda() && VisibleCudaDevices() > 0;
  for (const auto& [gemm, attention] :
       std::vector<std::pair<std::string, std::string>>{{"bf16", "auto"}, {"fp32", "flash"}}) {
    const absl::Status s = ValidateDeviceFlagsHere("auto", gemm, attention);
    if (gpu) {
      EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("--device auto is the CPU here"), std::string::npos) << s;
  }
  EXPECT_TRUE(ValidateDeviceFlagsHere("auto", "fp32", "reference").ok());
  EXPECT_TRUE(ValidateDeviceFlagsHere("cuda", "bf16", "flash").ok());
  EXPECT_EQ(ValidateDeviceFlagsHere("cpu", "bf16").code(), absl::StatusCode::kInvalidArgument);
  // The caller's own flag name (up's --worker-device) is the one named.
  if (!gpu) {
    const absl::Status s = ValidateDeviceFlagsHere("auto", "tf32", "auto", "--worker-device");
    EXPECT_NE(s.message().find("(--worker-device auto is the CPU here"), std::string::npos) << s;
  }
}

TEST(BackendSelectTest, ReducedPrecisionOnCpu_InvalidArgument) {
  for (const std::string gemm : {"tf32", "bf16"}) {
    absl::StatusOr<SelectedBackend> s = SelectBackend("cpu", gemm);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("--gemm " + gemm + " needs a CUDA device"),
              std::string::npos)
        << s.status();
  }
}

// The GPUs this machine has, counted by the runtime rather than by the
// selection under test; a runtime that cannot count them fails the test.
int DevicesHere() {
  const absl::StatusOr<int> devices = CudaDevicesOrError();
  EXPECT_TRUE(devices.ok()) << devices.status();
  return devices.value_or(0);
}

// Without CUDA compiled in, "cuda" says how to get it; with CUDA but no
// device it is NOT_FOUND; with a device it is a CUDA backend.
TEST(BackendSelectTest, Cuda_DependsOnBuildAndDevice) {
  absl::StatusOr<SelectedBackend> s = SelectBackend("cuda", "fp32");
  if (!BuiltWithCuda()) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.status().message().find("--config=cuda"), std::string::npos) << s.status();
  } else if (DevicesHere() == 0) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  } else {
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->backend->kind(), BackendKind::kCuda);
    EXPECT_NE(s->owned, nullptr);
  }
}

// auto never fails for lack of a GPU: it falls back to the CPU; with one
// (and CUDA compiled in) it is the GPU.
TEST(BackendSelectTest, Auto_CpuWithoutDeviceElseCuda) {
  absl::StatusOr<SelectedBackend> s = SelectBackend("auto", "fp32");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend->kind(),
            BuiltWithCuda() && DevicesHere() > 0 ? BackendKind::kCuda : BackendKind::kCpu);
}

}  // namespace
}  // namespace pipetrain
