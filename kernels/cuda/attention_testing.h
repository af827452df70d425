// What the attention kernels' tests share (attention_test.cc for the
// reference kernels, attention_gemm_test.cc for the GEMM ones): the shapes,
// the tolerances against the CPU (attention_test.cc's header gives their
// reasons), and NaN-filled outputs. Test-only.
#ifndef PIPETRAIN_KERNELS_CUDA_ATTENTION_TESTING_H_
#define PIPETRAIN_KERNELS_CUDA_ATTENTION_TESTING_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"

namespace pipetrain {
namespace testing {

constexpr float kAttentionOutAtol = 5e-6f;
constexpr float kAttentionProbsAtol = 2e-6f;
constexpr float kAttentionGradAtol = 3e-5f;  // dq, dk, dv
constexpr float kAttentionRtol = 1e-5f;

struct AttentionShape {
  int batch;
  int seq_len;
  int c;
  int heads;
  int64_t qkv_size() const { return int64_t{batch} * seq_len * 3 * c; }
  int64_t out_size() const { return int64_t{batch} * seq_len * c; }
  int64_t probs_size() const { return int64_t{batch} * heads * seq_len * seq_len; }
  // e.g. "[b 2, t 7, c 24, h 3] probs"
  std::string Name(const char* tensor) const {
    return "[b " + std::to_string(batch) + ", t " + std::to_string(seq_len) + ", c " +
           std::to_string(c) + ", h " + std::to_string(heads) + "] " + tensor;
  }
};

// One position; head_dim 4, 8, 64 and 24; seq_len around and past the
// 128-thread row block (keys per thread 1, 2 and 3); one head; GPT-2
// small's layer (seq_len 1024, c 768, 12 heads).
inline constexpr AttentionShape kAttentionShapes[] = {
    {1, 1, 8, 2}, {2, 7, 24, 3}, {1, 33, 64, 1}, {2, 129, 96, 4}, {1, 300, 128, 2},
    {1, 1024, 768, 12}};

// A device buffer of n NaNs: an output element a kernel fails to write
// stays NaN and fails the comparison.
inline absl::StatusOr<DeviceBuffer<float>> NaNBuffer(int64_t n) {
  return DeviceBuffer<float>::FromHost(
      std::vector<float>(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN()));
}

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_ATTENTION_TESTING_H_
