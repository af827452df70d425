#include "worker/model/nccl_abort_flag.h"

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::Status NcclAbortFlag::Check() const {
  if (!is_set()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(owner_, " was aborted (the job stopped)"));
}

NcclJoinLimits NcclAbortFlag::UntilSet() const {
  return NcclJoinLimits{absl::InfiniteFuture(), [this] { return is_set(); }};
}

absl::Status NcclAbortFlag::Flush(const std::vector<cudaStream_t>& streams, absl::Duration timeout,
                                  const std::function<bool()>& cancelled,
                                  const std::string& what) const {
  RETURN_IF_ERROR(Check());
  NcclJoinLimits limits;
  limits.deadline = MonotonicClock()->Now() + timeout;
  limits.cancelled = [this, &cancelled] {
    return is_set() || (cancelled != nullptr && cancelled());
  };
  const absl::Status drained = AwaitCudaStreams(streams, limits, what);
  RETURN_IF_ERROR(Check());
  return drained;
}

bool DrainNcclStreams(const std::vector<cudaStream_t>& streams, absl::Duration timeout,
                      const std::string& what) {
  return AwaitCudaStreams(streams, NcclJoinLimits{MonotonicClock()->Now() + timeout, nullptr}, what)
      .ok();
}

}  // namespace pipetrain
