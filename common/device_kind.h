// The device kind a worker's profiles are made and cached for: the one rule
// shared by the worker's profiler (which writes it into each profile) and the
// coordinator's profile cache (which keys profiles by it).
#ifndef PIPETRAIN_COMMON_DEVICE_KIND_H_
#define PIPETRAIN_COMMON_DEVICE_KIND_H_

#include <string>

#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// "cuda:" + the GPU model for a worker that computes on a GPU, else
// "cpu:" + the CPU model.
std::string DeviceKind(const v1::DeviceInfo& device);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_DEVICE_KIND_H_
