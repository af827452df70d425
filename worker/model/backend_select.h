// Choosing a Backend from the user's flags: --device auto|cpu|cuda|cuda:N and
// --gemm fp32|tf32|bf16 (the CUDA issue, scope 4).
//
//   auto    CUDA device 0 when this binary was built with CUDA
//           (--config=cuda) and a device is visible; otherwise the CPU.
//   cpu     the CPU backend.
//   cuda    CUDA device 0 (cuda:N: device N); an error when the binary has
//           no CUDA or the device is missing, never a silent CPU fallback.
//
// --gemm picks cuBLAS's GEMM mode on CUDA (fp32 is the default, and what
// the parity checks against the CPU use; tf32 and bf16 are the tensor-core
// modes, kernels/cuda/linear.h); the CPU backend always computes in fp32, so
// tf32 or bf16 with a CPU device is INVALID_ARGUMENT rather than silently
// ignored. --attention auto|reference|gemm|flash picks how CUDA computes
// attention (cuda_backend.h AttentionImpl). auto, the default, is gemm on
// CUDA (its parity and determinism shown on an H200, 8.8x the reference
// kernels' GPT-2 124M step there; docs/benchmarks.md) and the CPU's one
// attention on the CPU; gemm
// or flash with a CPU device is INVALID_ARGUMENT likewise. Thread-safe.
#ifndef PIPETRAIN_WORKER_MODEL_BACKEND_SELECT_H_
#define PIPETRAIN_WORKER_MODEL_BACKEND_SELECT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/backend.h"

namespace pipetrain {

// The --attention flag's help, the same for every program that takes it.
inline constexpr char kAttentionFlagHelp[] =
    "attention on CUDA: auto (gemm on CUDA; the CPU's own on the CPU) | reference (row "
    "kernels) | gemm (cuBLAS batched GEMMs) | flash (fused, bf16 tensor cores)";

// Whether this binary contains the CUDA backend.
bool BuiltWithCuda();

// Asks CUDA to load every kernel when the process's CUDA context is made
// (CUDA_MODULE_LOADING=EAGER), unless the environment already says how.
// Call it before the first CUDA call of a process whose stages may use NCCL
// device links (the worker's main does). Why: with lazy loading (CUDA's
// default since 12.2) the first launch of a kernel loads its module under
// the context lock, waiting for the device's queued work to drain; an NCCL
// receive queued on a link stream is such work and waits for its peer,
// which may itself be waiting for a tensor this stage sends only after
// that launch: a deadlock. Eager loading costs time and device memory once
// at start-up (every kernel of cuBLAS and ours). Has effect only before
// CUDA initialises in this process.
void PreferEagerCudaModuleLoading();

// Visible CUDA devices: 0 in a binary built without CUDA or without a
// device or driver.
int VisibleCudaDevices();
// The same, but a runtime that fails otherwise (a driver that does not work
// on a machine with a GPU) is an error rather than 0.
absl::StatusOr<int> CudaDevicesOrError();

struct SelectedBackend {
  std::unique_ptr<Backend> owned;  // the CUDA backend; null for the CPU one
  Backend* backend = nullptr;      // never null on success
};

// The flags' syntax alone (for usage errors before any work): INVALID_ARGUMENT
// for an unknown device or gemm value (the message lists the accepted ones)
// or tf32/bf16 with --device cpu.
absl::Status ValidateDeviceFlags(const std::string& device, const std::string& gemm,
                                 const std::string& attention = "auto");

// ValidateDeviceFlags with `auto` read as this host resolves it: the CPU
// where no CUDA device is visible, so tf32/bf16 or a GPU attention with
// --device auto is a usage error here (the message says why) rather than
// SelectBackend's later refusal (OK where CUDA fails to count its devices:
// SelectBackend reports that error). Looks for CUDA devices only when device is
// auto and the other flags ask for a GPU-only mode: call
// PreferEagerCudaModuleLoading first where the process may use NCCL links.
// `device_flag` is the device flag's name in the caller's command line (the
// message says that flag's auto is the CPU here).
absl::Status ValidateDeviceFlagsHere(const std::string& device, const std::string& gemm,
                                     const std::string& attention = "auto",
                                     const char* device_flag = "--device");

// For `device` cuda or cuda:N (N >= 0), where `flag` is the caller's name
// for the device flag ("--device", "--worker-device"): FAILED_PRECONDITION
// when the binary was built without CUDA, when no CUDA device is visible,
// or when N is beyond the visible ones, each saying what to do. OK for any
// other device, and when `visible` (CudaDevicesOrError) is an error: a CUDA
// runtime that cannot count its devices is not "no GPU", and SelectBackend
// reports its error as it is.
absl::Status CheckCudaDeviceVisible(const std::string& device, const char* flag,
                                    bool built_with_cuda, const absl::StatusOr<int>& visible);

// ValidateDeviceFlags' errors, and INVALID_ARGUMENT for tf32/bf16 when auto
// resolves to the CPU; FAILED_PRECONDITION for cuda in a
// binary built without CUDA; NOT_FOUND for a CUDA device that is not
// visible; INTERNAL for CUDA setup failures.
absl::StatusOr<SelectedBackend> SelectBackend(const std::string& device, const std::string& gemm,
                                              const std::string& attention = "auto");

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_BACKEND_SELECT_H_
