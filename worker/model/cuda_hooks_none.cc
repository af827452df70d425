// cuda_hooks for a binary built without --config=cuda.
#include "worker/model/cuda_hooks.h"

namespace pipetrain {
namespace cuda_hooks {

bool Available() { return false; }

absl::StatusOr<int> DeviceCount() { return 0; }

absl::StatusOr<std::unique_ptr<Backend>> Create(int /*device*/, const std::string& /*gemm*/,
                                                const std::string& /*attention*/) {
  return absl::FailedPreconditionError(
      "this binary was built without CUDA: rebuild with `bazel build --config=cuda ...`, "
      "or use --device cpu");
}

}  // namespace cuda_hooks
}  // namespace pipetrain
