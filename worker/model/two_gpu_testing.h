// What the tests of NCCL between two CUDA backends share (testonly): eager
// module loading, the skip on machines with fewer than two GPUs, and a body
// run as rank 0 and rank 1 at once.
#ifndef PIPETRAIN_WORKER_MODEL_TWO_GPU_TESTING_H_
#define PIPETRAIN_WORKER_MODEL_TWO_GPU_TESTING_H_

#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "worker/model/backend_select.h"

namespace pipetrain {
namespace testing {

// As the worker's main: before CUDA initialises (static initialisation
// runs before gtest's main), so that no kernel loads lazily while a
// transfer waits for its peer (backend_select.h).
inline const bool kEagerCudaModules = [] {
  PreferEagerCudaModuleLoading();
  return true;
}();

// Runs body(rank) for ranks 0 and 1 on a thread each (NCCL's joins block
// until both are there) and returns their results.
template <typename Body>
std::vector<absl::Status> OnBothRanks(Body body) {
  std::vector<absl::Status> errors(2);
  std::thread other([&] { errors[1] = body(1); });
  errors[0] = body(0);
  other.join();
  return errors;
}

}  // namespace testing
}  // namespace pipetrain

// Skips the test on a machine with fewer than two GPUs; fails it when the
// runtime cannot count them (CudaDeviceCount reads "no GPU" as 0, so its
// error is a fault a skip would hide).
#define SKIP_UNLESS_TWO_GPUS()                                                                   \
  do {                                                                                           \
    const absl::StatusOr<int> devices = ::pipetrain::CudaDeviceCount();                          \
    ASSERT_TRUE(devices.ok()) << devices.status();                                               \
    if (*devices < 2) {                                                                          \
      GTEST_SKIP() << *devices                                                                   \
                   << " GPU(s): a two-rank group needs two (NCCL refuses two ranks on one GPU)"; \
    }                                                                                            \
  } while (false)

#endif  // PIPETRAIN_WORKER_MODEL_TWO_GPU_TESTING_H_
