// The CUDA devices this process can see.
//
// A machine without a GPU, or without the NVIDIA driver, is a normal
// situation here (development and CI machines have the toolkit only): it has
// zero devices, not an error. All functions are thread-safe.
#ifndef PIPETRAIN_KERNELS_CUDA_DEVICE_H_
#define PIPETRAIN_KERNELS_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  int64_t total_memory_bytes = 0;
  int sm_count = 0;       // streaming multiprocessors
  int compute_major = 0;  // compute capability, e.g. 9.0 for H100
  int compute_minor = 0;
  // The GPU's PCI address, as cudaDeviceGetPCIBusId gives it (e.g.
  // "0000:3B:00.0"): one per physical GPU on a host whatever ordinal
  // CUDA_VISIBLE_DEVICES gives it in this process, and what NCCL tells GPUs
  // apart by (it refuses two ranks with one bus id; MIG instances of one
  // GPU share it).
  std::string pci_bus_id;
};

// Number of visible CUDA devices (respects CUDA_VISIBLE_DEVICES). 0 when no
// device is present or no driver is installed. INTERNAL for any other CUDA
// failure (e.g. a driver older than the runtime), naming the CUDA error.
absl::StatusOr<int> CudaDeviceCount();

// Facts about device `index`. INVALID_ARGUMENT if index < 0; NOT_FOUND if
// index >= CudaDeviceCount() (the message names the index and the count);
// INTERNAL if CUDA fails.
absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int index);

// The compute capability this build's kernels run on: tools/cuda/cuda.bzl
// compiles them for sm_90 with compute_90 PTX, which the driver can JIT for
// later GPUs but not for earlier ones. Keep the two in step.
inline constexpr int kKernelsComputeMajor = 9;
inline constexpr int kKernelsComputeMinor = 0;

// OK when `device` can run this build's kernels; FAILED_PRECONDITION
// naming the GPU, its compute capability and the build's otherwise, so a
// backend refuses the GPU at once instead of failing its first kernel
// launch mid-step (cudaErrorNoKernelImageForDevice).
absl::Status CheckKernelsRunOn(const CudaDeviceInfo& device);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_DEVICE_H_
