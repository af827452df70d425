// ProfileCache: measured model profiles kept by the coordinator per (model
// shape, sequence length, micro-batch size, device kind), so a model is
// profiled once per kind of device (the Planner issue, scope 1). In memory;
// with durable state the JobManager also saves each profile it puts here
// and loads them back at start-up (CoordinatorState::SaveProfile), so a
// restarted coordinator does not profile again. Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_JOBS_PROFILE_CACHE_H_
#define PIPETRAIN_COORDINATOR_JOBS_PROFILE_CACHE_H_

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "coordinator/planner/profile.h"
#include "common/device_kind.h"  // DeviceKind: the device part of a key
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/profile.pb.h"

namespace pipetrain {

// The cache key of a profile request on a device kind.
std::string ProfileKey(const v1::ProfileRequest& request, const std::string& device_kind);

// The planner's view of a measured profile.
ModelProfile FromProto(const v1::ModelProfile& profile);

class ProfileCache {
 public:
  std::optional<v1::ModelProfile> Get(const std::string& key) const;
  void Put(const std::string& key, const v1::ModelProfile& profile);
  int size() const;

 private:
  mutable AnnotatedMutex mu_;
  std::map<std::string, v1::ModelProfile> profiles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_PROFILE_CACHE_H_
