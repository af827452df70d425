// FlashOnCpu (testonly): the CPU backend with the flash-style attention's
// contract, computed by the GPU kernels' CPU twin
// (kernels/cpu/flash_attention.h): without `probabilities` it keeps each
// row's log-sum-exp (Backend::AttentionSavedFloats) and reads the forward's
// output in the backward, as CudaBackend's AttentionImpl::kFlash does; with
// them, the CPU's attention. So the units' handling of what attention keeps
// (partition offsets, KeepTokenImportance, the backward's choice) is tested
// without a GPU.
//
//   FlashOnCpu flash;
//   auto unit = MakeUnit(config, 1, &flash);
//
// Thread-safe as the CPU backend (no state of its own).
#ifndef PIPETRAIN_WORKER_MODEL_FLASH_CPU_TESTING_H_
#define PIPETRAIN_WORKER_MODEL_FLASH_CPU_TESTING_H_

#include <cstdint>

#include "kernels/cpu/flash_attention.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"

namespace pipetrain {

class FlashOnCpu : public ForwardingBackend {
 public:
  FlashOnCpu() : ForwardingBackend(CpuBackend()) {}

  int64_t AttentionSavedFloats(int batch, int seq_len, int c, int heads,
                               bool probabilities) const override {
    return probabilities ? inner()->AttentionSavedFloats(batch, seq_len, c, heads, true)
                         : int64_t{batch} * heads * seq_len;
  }
  void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads,
                        bool probabilities, float* out, float* saved) override {
    if (probabilities) {
      inner()->AttentionForward(qkv, batch, seq_len, c, heads, true, out, saved);
    } else {
      FlashAttentionForward(qkv, batch, seq_len, c, heads, out, saved);
    }
  }
  void AttentionBackward(const float* qkv, const float* out, const float* saved, bool probabilities,
                         const float* dout, int batch, int seq_len, int c, int heads, float* dqkv,
                         float* scratch) override {
    if (probabilities) {
      inner()->AttentionBackward(qkv, out, saved, true, dout, batch, seq_len, c, heads, dqkv,
                                 scratch);
    } else {
      FlashAttentionBackward(qkv, out, saved, dout, batch, seq_len, c, heads, dqkv);
    }
  }
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_FLASH_CPU_TESTING_H_
