#include "worker/model/backend_select.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/cuda_hooks.h"

namespace pipetrain {
namespace {

// The CUDA device index "cuda" or "cuda:N" names; -1 for any other string.
int ParseCudaDevice(const std::string& device) {
  if (device == "cuda") return 0;
  int index = -1;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) &&
      index >= 0) {
    return index;
  }
  return -1;
}

absl::Status ReducedPrecisionOnCpu(const std::string& gemm) {
  return absl::InvalidArgumentError(
      absl::StrCat("--gemm ", gemm, " needs a CUDA device; the CPU backend computes in fp32"));
}

absl::Status DeviceAttentionOnCpu(const std::string& attention) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--attention ", attention, " needs a CUDA device; the CPU backend has one attention"));
}

// Whether the CPU backend can honour `attention`: it has one attention,
// which "auto" and "reference" both name.
bool OnCpu(const std::string& attention) { return attention == "auto" || attention == "reference"; }

absl::StatusOr<SelectedBackend> Cuda(int device, const std::string& gemm,
                                     const std::string& attention) {
  SelectedBackend selected;
  // auto is the GEMM attention on CUDA (backend_select.h says why).
  ASSIGN_OR_RETURN(selected.owned,
                   cuda_hooks::Create(device, gemm, attention == "auto" ? "gemm" : attention));
  selected.backend = selected.owned.get();
  return selected;
}

}  // namespace

bool BuiltWithCuda() { return cuda_hooks::Available(); }

void PreferEagerCudaModuleLoading() { setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0); }

int VisibleCudaDevices() { return CudaDevicesOrError().value_or(0); }

absl::StatusOr<int> CudaDevicesOrError() { return cuda_hooks::DeviceCount(); }

absl::Status ValidateDeviceFlags(const std::string& device, const std::string& gemm,
                                 const std::string& attention) {
  if (attention != "auto" && attention != "reference" && attention != "gemm" &&
      attention != "flash") {
    return absl::InvalidArgumentError(
        absl::StrCat("--attention must be auto, reference, gemm or flash, got '", attention, "'"));
  }
  if (gemm != "fp32" && gemm != "tf32" && gemm != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gemm must be fp32, tf32 or bf16, got '", gemm, "'"));
  }
  if (device != "auto" && device != "cpu" && ParseCudaDevice(device) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be auto, cpu, cuda or cuda:N (N >= 0), got '", device, "'"));
  }
  if (device == "cpu" && gemm != "fp32") return ReducedPrecisionOnCpu(gemm);
  if (device == "cpu" && !OnCpu(attention)) return DeviceAttentionOnCpu(attention);
  return absl::OkStatus();
}

absl::Status ValidateDeviceFlagsHere(const std::string& device, const std::string& gemm,
                                     const std::string& attention, const char* device_flag) {
  RETURN_IF_ERROR(ValidateDeviceFlags(device, gemm, attention));
  if (device != "auto" || (gemm == "fp32" && OnCpu(attention))) return absl::OkStatus();
  // A CUDA error (a driver mismatch, busy exclusive-process GPUs) is not
  // "no GPU": SelectBackend reports it as the startup failure it is.
  const absl::StatusOr<int> devices = CudaDevicesOrError();
  if (!devices.ok() || *devices > 0) return absl::OkStatus();
  const absl::Status on_cpu = ValidateDeviceFlags("cpu", gemm, attention);
  return absl::Status(on_cpu.code(),
                      absl::StrCat(on_cpu.message(), " (", device_flag,
                                   " auto is the CPU here: no CUDA device is visible)"));
}

absl::Status CheckCudaDeviceVisible(const std::string& device, const char* flag,
                                    bool built_with_cuda, const absl::StatusOr<int>& visible) {
  const int index = ParseCudaDevice(device);
  if (index < 0) return absl::OkStatus();
  const std::string named = absl::StrCat(flag, " ", device);
  if (!built_with_cuda) {
    return absl::FailedPreconditionError(
        absl::StrCat(named,
                     ": this binary was built without CUDA (rebuild with --config=cuda), "
                     "or use ",
                     flag, " cpu or auto"));
  }
  if (!visible.ok()) return absl::OkStatus();
  if (*visible == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        named, ": no CUDA device visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"));
  }
  if (index >= *visible) {
    return absl::FailedPreconditionError(absl::StrCat(
        named, ": only ", *visible, " CUDA device(s) visible, cuda:0 to cuda:", *visible - 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<SelectedBackend> SelectBackend(const std::string& device, const std::string& gemm,
                                              const std::string& attention) {
  RETURN_IF_ERROR(ValidateDeviceFlags(device, gemm, attention));
  const int cuda_device = ParseCudaDevice(device);
  if (cuda_device >= 0) return Cuda(cuda_device, gemm, attention);
  if (device == "auto" && cuda_hooks::Available()) {
    ASSIGN_OR_RETURN(const int count, cuda_hooks::DeviceCount());
    if (count > 0) return Cuda(0, gemm, attention);
  }
  if (gemm != "fp32") return ReducedPrecisionOnCpu(gemm);
  if (!OnCpu(attention)) return DeviceAttentionOnCpu(attention);
  SelectedBackend selected;
  selected.backend = CpuBackend();
  return selected;
}

}  // namespace pipetrain
