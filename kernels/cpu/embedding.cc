#include "kernels/cpu/embedding.h"

namespace pipetrain {

void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, int batch,
                      int seq_len, int c, float* out) {
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq_len; ++t) {
      int64_t row = static_cast<int64_t>(b) * seq_len + t;
      const float* te = wte + static_cast<int64_t>(tokens[row]) * c;
      const float* pe = wpe + static_cast<int64_t>(t) * c;
      float* o = out + row * c;
      for (int j = 0; j < c; ++j) o[j] = te[j] + pe[j];
    }
  }
}

void EmbeddingBackward(const int32_t* tokens, const float* dout, int batch, int seq_len, int c,
                       float* dwte, float* dwpe) {
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq_len; ++t) {
      int64_t row = static_cast<int64_t>(b) * seq_len + t;
      const float* d = dout + row * c;
      float* te = dwte + static_cast<int64_t>(tokens[row]) * c;
      float* pe = dwpe + static_cast<int64_t>(t) * c;
      for (int j = 0; j < c; ++j) {
        te[j] += d[j];
        pe[j] += d[j];
      }
    }
  }
}

}  // namespace pipetrain
