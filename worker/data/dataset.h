// Dataset: a token corpus split into train and validation, and the batches
// a training job reads from it.
//
// Training samples are a pure function of (seed, iteration, index): sample
// `index` of iteration `iteration` is the window of seq_len + 1 consecutive
// train tokens starting at
//   UniformIndex(seed, a = iteration & 0xffffffff,
//                      b = (iteration >> 32) ^ kTrainSamplePurpose,
//                      c = index, bound = train_tokens - seq_len)
// so starts lie in [0, train_tokens - seq_len - 1] and every window stays
// inside the train split. Any worker can produce any sample, and how a
// global batch is cut into micro-batches does not change the samples (the
// first stage reads inputs, the last stage the targets of the same windows).
//
// Validation windows are fixed and independent of any seed: window k covers
// val tokens [k * seq_len, k * seq_len + seq_len] (seq_len + 1 tokens), so
// consecutive windows share exactly one token (the last target of window k is
// the first input of window k + 1) and every val token after the first is a
// target exactly once. num_val_windows() = (val_tokens - 1) / seq_len; the
// last (val_tokens - 1) % seq_len tokens (fewer than seq_len) are not used.
//
// The corpus is held behind a shared_ptr to const: copies are cheap, and all
// const methods are thread-safe.
#ifndef PIPETRAIN_WORKER_DATA_DATASET_H_
#define PIPETRAIN_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain {

// B sequences of T tokens: inputs[b*T + t], and targets[b*T + t] = the token
// that follows inputs[b*T + t] in the corpus.
struct TokenBatch {
  int batch = 0;
  int seq_len = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// Mixed into the UniformIndex `b` argument so train sampling draws never
// coincide with draws other modules make from the same seed.
inline constexpr uint32_t kTrainSamplePurpose = 0x54524e31;  // "TRN1"

// What Dataset::Create's errors call the sequence length and the
// validation fraction.
struct DatasetSettingNames {
  const char* seq_len = "--seq-len";
  const char* val_fraction = "--val-fraction";
};

class Dataset {
 public:
  // Splits `tokens` into train (the first part) and validation (the last
  // floor(tokens.size() * val_fraction) tokens).
  // Requires seq_len >= 1 and 0 <= val_fraction < 1; the train split must
  // hold at least seq_len + 1 tokens, and so must the val split when
  // val_fraction > 0. Errors: INVALID_ARGUMENT naming the counts and what to
  // change, by the names in `settings` (train-local's flags by default; a
  // job's spec fields for a worker).
  static absl::StatusOr<Dataset> Create(std::vector<uint16_t> tokens, int seq_len,
                                        double val_fraction,
                                        DatasetSettingNames settings = DatasetSettingNames());

  int seq_len() const { return seq_len_; }
  int64_t train_tokens() const { return train_tokens_; }
  int64_t val_tokens() const { return static_cast<int64_t>(tokens_->size()) - train_tokens_; }
  // The whole corpus: the train split, then the val split.
  const std::vector<uint16_t>& tokens() const { return *tokens_; }

  // Start (offset into the train split) of sample `index` of `iteration`; in
  // [0, train_tokens - seq_len - 1]. Requires 0 <= index < 2^32 (CHECK).
  int64_t TrainWindowStart(uint64_t seed, int64_t iteration, int64_t index) const;

  // Samples [first_index, first_index + count) of `iteration`, in order.
  // Requires first_index >= 0, count >= 0, first_index + count <= 2^32 (CHECK).
  TokenBatch TrainBatch(uint64_t seed, int64_t iteration, int64_t first_index, int count) const;

  // Number of validation windows; 0 when there is no val split.
  int64_t num_val_windows() const;

  // Start (offset into the val split) of window k: k * seq_len.
  // Requires 0 <= k < num_val_windows() (CHECK).
  int64_t ValWindowStart(int64_t k) const;

  // Windows [first_window, first_window + count) as a batch of `count`.
  // Requires count >= 0 and the windows in range (CHECK).
  TokenBatch ValBatch(int64_t first_window, int count) const;

 private:
  Dataset(std::shared_ptr<const std::vector<uint16_t>> tokens, int seq_len, int64_t train_tokens)
      : tokens_(std::move(tokens)), seq_len_(seq_len), train_tokens_(train_tokens) {}

  // Appends the window of seq_len + 1 corpus tokens at absolute `offset` to
  // row `row` of `batch`.
  void FillRow(int64_t offset, int row, TokenBatch* batch) const;

  std::shared_ptr<const std::vector<uint16_t>> tokens_;  // train, then val
  int seq_len_;
  int64_t train_tokens_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_DATASET_H_
