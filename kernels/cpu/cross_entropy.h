// Fused softmax + cross-entropy over a vocabulary.
//
// Forward: for n rows of logits [n, vocab] and targets [n] in [0, vocab),
// writes probs = softmax(logits) [n, vocab] and returns the mean loss
// (1/n) sum_i -log probs[i, targets[i]], accumulated in double. probs may
// alias logits (softmax in place).
// Backward: dlogits = (probs - onehot(targets)) * dloss / n, the gradient of
// dloss * mean_loss; it may alias probs (computed in place).
// Every matrix has row stride `ld` >= vocab (row i starts at i * ld; the
// ld - vocab floats after each row are neither read nor written), so that
// a device backend can keep the logits' rows aligned (Backend::
// LogitsRowStride); ld == vocab is the packed layout.
#ifndef PIPETRAIN_KERNELS_CPU_CROSS_ENTROPY_H_
#define PIPETRAIN_KERNELS_CPU_CROSS_ENTROPY_H_

#include <cstdint>

namespace pipetrain {

float SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, int n, int vocab,
                                 int ld, float* probs);

void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, int n, int vocab,
                                 int ld, float dloss, float* dlogits);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_CROSS_ENTROPY_H_
