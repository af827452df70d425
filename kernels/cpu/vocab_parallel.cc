#include "kernels/cpu/vocab_parallel.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/target_clones.h"

namespace pipetrain {

void VocabSliceEmbeddingForward(const int32_t* tokens, const float* wte_slice, const float* wpe,
                                int batch, int seq_len, int c, int vocab_begin, int vocab_end,
                                float* out) {
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq_len; ++t) {
      const int64_t row = static_cast<int64_t>(b) * seq_len + t;
      const int32_t token = tokens[row];
      const bool mine = token >= vocab_begin && token < vocab_end;
      const float* te = mine ? wte_slice + static_cast<int64_t>(token - vocab_begin) * c : nullptr;
      const float* pe = wpe != nullptr ? wpe + static_cast<int64_t>(t) * c : nullptr;
      float* o = out + row * c;
      // 0 + pe and te + 0 are exact, so the ranks' sum is te + pe exactly.
      for (int j = 0; j < c; ++j) o[j] = (te ? te[j] : 0.0f) + (pe ? pe[j] : 0.0f);
    }
  }
}

void VocabSliceEmbeddingBackward(const int32_t* tokens, const float* dout, int batch, int seq_len,
                                 int c, int vocab_begin, int vocab_end, float* dwte_slice,
                                 float* dwpe) {
  // Row order as EmbeddingBackward, so each table row sums in the same order.
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq_len; ++t) {
      const int64_t row = static_cast<int64_t>(b) * seq_len + t;
      const int32_t token = tokens[row];
      const float* d = dout + row * c;
      if (token >= vocab_begin && token < vocab_end) {
        float* te = dwte_slice + static_cast<int64_t>(token - vocab_begin) * c;
        for (int j = 0; j < c; ++j) te[j] += d[j];
      }
      if (dwpe != nullptr) {
        float* pe = dwpe + static_cast<int64_t>(t) * c;
        for (int j = 0; j < c; ++j) pe[j] += d[j];
      }
    }
  }
}

PT_TARGET_CLONES
void VocabSliceRowMax(const float* logits, int n, int local_vocab, float* row_max) {
  for (int i = 0; i < n; ++i) {
    const float* x = logits + static_cast<int64_t>(i) * local_vocab;
    float max = x[0];
    for (int j = 1; j < local_vocab; ++j) max = x[j] > max ? x[j] : max;
    row_max[i] = max;
  }
}

PT_TARGET_CLONES
void VocabSliceSoftmaxPartials(const float* logits, const int32_t* targets, int n, int local_vocab,
                               int vocab_begin, const float* global_max, float* probs,
                               float* sum_exp, float* target_shifted) {
  for (int i = 0; i < n; ++i) {
    const float* x = logits + static_cast<int64_t>(i) * local_vocab;
    float* p = probs + static_cast<int64_t>(i) * local_vocab;
    const float max = global_max[i];
    const int32_t local_target = targets[i] - vocab_begin;
    // Read the target logit first: probs may alias logits.
    target_shifted[i] =
        local_target >= 0 && local_target < local_vocab ? x[local_target] - max : 0.0f;
    float sum = 0.0f;
    for (int j = 0; j < local_vocab; ++j) {
      p[j] = FastExp(x[j] - max);
      sum += p[j];
    }
    sum_exp[i] = sum;
  }
}

PT_TARGET_CLONES
float VocabSliceSoftmaxFinish(const float* total_sum_exp, const float* total_target_shifted, int n,
                              int local_vocab, float* probs) {
  double total = 0.0;
  for (int i = 0; i < n; ++i) {
    float* p = probs + static_cast<int64_t>(i) * local_vocab;
    const float inv = 1.0f / total_sum_exp[i];
    for (int j = 0; j < local_vocab; ++j) p[j] *= inv;
    // -log p[target] = log Z - (x[target] - M): exact even when p underflows.
    total += static_cast<double>(std::log(total_sum_exp[i])) - total_target_shifted[i];
  }
  return static_cast<float>(total / n);
}

void VocabSliceCrossEntropyBackward(const float* probs, const int32_t* targets, int n,
                                    int local_vocab, int vocab_begin, float dloss, float* dlogits) {
  const float scale = dloss / n;
  for (int i = 0; i < n; ++i) {
    const float* p = probs + static_cast<int64_t>(i) * local_vocab;
    float* d = dlogits + static_cast<int64_t>(i) * local_vocab;
    for (int j = 0; j < local_vocab; ++j) d[j] = p[j] * scale;
    const int32_t local_target = targets[i] - vocab_begin;
    if (local_target >= 0 && local_target < local_vocab) d[local_target] -= scale;
  }
}

}  // namespace pipetrain
