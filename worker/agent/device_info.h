// What a worker tells the coordinator about its machine at registration.
#ifndef PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_
#define PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_

#include <string>

#include "proto/pipetrain/v1/coordinator.pb.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_backend.h"

namespace pipetrain {

// Hostname, CPU model (/proc/cpuinfo), online cores, physical memory, the
// backend the worker computes on and, for a GPU, its name, memory and SM
// count; and GEMM GFLOP/s measured on that backend (a short sgemm: n = 384
// on the CPU, ~0.1 s; n = 4096 on a GPU).
v1::DeviceInfo CollectDeviceInfo(Backend* backend = CpuBackend());

// The CPU's model name from /proc/cpuinfo ("unknown" if absent).
std::string CpuModelName();

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_
