// What a worker tells the coordinator about its machine at registration.
#ifndef PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_
#define PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_

#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// Hostname, CPU model (/proc/cpuinfo), online cores, physical memory, and
// fp32 GEMM GFLOP/s measured with a short sgemm (~0.1 s). No GPU fields yet.
v1::DeviceInfo CollectDeviceInfo();

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_
