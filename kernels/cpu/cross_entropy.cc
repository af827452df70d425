#include "kernels/cpu/cross_entropy.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/target_clones.h"

namespace pipetrain {
namespace {

// Softmax of one row; returns log(sum exp(x - max)) + max = logsumexp(x).
PT_TARGET_CLONES
float SoftmaxRow(const float* x, int vocab, float* p) {
  float max = x[0];
  for (int j = 1; j < vocab; ++j) max = x[j] > max ? x[j] : max;
  float sum = 0.0f;
  for (int j = 0; j < vocab; ++j) {
    p[j] = FastExp(x[j] - max);
    sum += p[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j < vocab; ++j) p[j] *= inv;
  return max + std::log(sum);
}

}  // namespace

float SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, int n, int vocab,
                                 int ld, float* probs) {
  double total = 0.0;
  for (int i = 0; i < n; ++i) {
    const float* x = logits + static_cast<int64_t>(i) * ld;
    // Read the target logit first: probs may alias logits.
    const float target_logit = x[targets[i]];
    float lse = SoftmaxRow(x, vocab, probs + static_cast<int64_t>(i) * ld);
    // -log p[target] = logsumexp - x[target]: exact even when p underflows.
    total += static_cast<double>(lse) - target_logit;
  }
  return static_cast<float>(total / n);
}

void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, int n, int vocab,
                                 int ld, float dloss, float* dlogits) {
  const float scale = dloss / n;
  for (int i = 0; i < n; ++i) {
    const float* p = probs + static_cast<int64_t>(i) * ld;
    float* d = dlogits + static_cast<int64_t>(i) * ld;
    for (int j = 0; j < vocab; ++j) d[j] = p[j] * scale;
    d[targets[i]] -= scale;
  }
}

}  // namespace pipetrain
