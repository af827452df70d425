#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstdint>
#include <vector>

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

TokenRowGroups GroupRowsByToken(const int32_t* tokens, int64_t rows, int vocab) {
  // One key per kept row, token in the high half and row in the low half:
  // sorting the keys sorts by token, then by row.
  std::vector<uint64_t> keys;
  keys.reserve(static_cast<size_t>(rows));
  TokenRowGroups out;
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t token = tokens[row];
    if (token < 0 || token >= vocab) {
      ++out.dropped;
      continue;
    }
    keys.push_back(static_cast<uint64_t>(token) << 32 | static_cast<uint32_t>(row));
  }
  std::sort(keys.begin(), keys.end());
  auto token_of = [](uint64_t key) { return static_cast<int32_t>(key >> 32); };
  for (size_t k = 0; k < keys.size(); ++k) {
    if (k == 0 || token_of(keys[k]) != token_of(keys[k - 1])) ++out.groups;
  }
  const size_t g = static_cast<size_t>(out.groups);
  out.index.resize(2 * g + 1 + keys.size());
  int32_t* group_tokens = out.index.data();
  int32_t* starts = group_tokens + g;
  int32_t* row_list = starts + g + 1;
  size_t group = 0;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (k == 0 || token_of(keys[k]) != token_of(keys[k - 1])) {
      group_tokens[group] = token_of(keys[k]);
      starts[group] = static_cast<int32_t>(k);
      ++group;
    }
    row_list[k] = static_cast<int32_t>(keys[k] & 0xffffffffu);
  }
  starts[g] = static_cast<int32_t>(keys.size());
  return out;
}

}  // namespace pipetrain
