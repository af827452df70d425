#include "worker/data/dataset.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/philox.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

constexpr int64_t kMaxSampleIndex = int64_t{1} << 32;

TokenBatch EmptyBatch(int count, int seq_len) {
  TokenBatch batch;
  batch.batch = count;
  batch.seq_len = seq_len;
  batch.inputs.resize(static_cast<size_t>(count) * seq_len);
  batch.targets.resize(static_cast<size_t>(count) * seq_len);
  return batch;
}

absl::Status CheckSplit(const char* split, int64_t have, int seq_len, absl::string_view remedy) {
  if (have >= static_cast<int64_t>(seq_len) + 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      split, " split has ", have,
      " tokens; need at least seq_len + 1 = ", static_cast<int64_t>(seq_len) + 1, "; ", remedy));
}

}  // namespace

absl::StatusOr<Dataset> Dataset::Create(std::vector<uint16_t> tokens, int seq_len,
                                        double val_fraction, DatasetSettingNames settings) {
  const char* seq = settings.seq_len;
  const char* val_name = settings.val_fraction;
  if (seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len is ", seq_len, "; it must be >= 1 (check ", seq, ")"));
  }
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "val_fraction is ", val_fraction, "; it must be in [0, 1) (check ", val_name, ")"));
  }
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t val = static_cast<int64_t>(std::floor(static_cast<double>(total) * val_fraction));
  const int64_t train = total - val;
  RETURN_IF_ERROR(CheckSplit(
      "train", train, seq_len,
      val > 0 ? absl::StrCat("use a larger file, a smaller ", seq, " or a smaller ", val_name)
              : absl::StrCat("use a larger file or a smaller ", seq)));
  if (val_fraction > 0) {
    RETURN_IF_ERROR(
        CheckSplit("val", val, seq_len,
                   absl::StrCat("use a larger file, a larger ", val_name, " or a smaller ", seq,
                                " (or ", val_name, " 0 for no validation)")));
  }
  auto shared = std::make_shared<const std::vector<uint16_t>>(std::move(tokens));
  return Dataset(std::move(shared), seq_len, train);
}

int64_t Dataset::TrainWindowStart(uint64_t seed, int64_t iteration, int64_t index) const {
  PT_CHECK(index >= 0 && index < kMaxSampleIndex) << "sample index " << index;
  const uint64_t it = static_cast<uint64_t>(iteration);
  const uint64_t bound = static_cast<uint64_t>(train_tokens_ - seq_len_);
  return static_cast<int64_t>(UniformIndex(seed, static_cast<uint32_t>(it),
                                           static_cast<uint32_t>(it >> 32) ^ kTrainSamplePurpose,
                                           static_cast<uint32_t>(index), bound));
}

TokenBatch Dataset::TrainBatch(uint64_t seed, int64_t iteration, int64_t first_index,
                               int count) const {
  PT_CHECK(first_index >= 0 && count >= 0 && first_index + count <= kMaxSampleIndex)
      << "train samples [" << first_index << ", " << first_index + count << ")";
  TokenBatch batch = EmptyBatch(count, seq_len_);
  for (int row = 0; row < count; ++row) {
    FillRow(TrainWindowStart(seed, iteration, first_index + row), row, &batch);
  }
  return batch;
}

int64_t Dataset::num_val_windows() const {
  const int64_t val = val_tokens();
  return val == 0 ? 0 : (val - 1) / seq_len_;
}

int64_t Dataset::ValWindowStart(int64_t k) const {
  PT_CHECK(k >= 0 && k < num_val_windows()) << "val window " << k << " of " << num_val_windows();
  return k * seq_len_;
}

TokenBatch Dataset::ValBatch(int64_t first_window, int count) const {
  PT_CHECK(first_window >= 0 && count >= 0 && first_window + count <= num_val_windows())
      << "val windows [" << first_window << ", " << first_window + count << ") of "
      << num_val_windows();
  TokenBatch batch = EmptyBatch(count, seq_len_);
  for (int row = 0; row < count; ++row) {
    FillRow(train_tokens_ + ValWindowStart(first_window + row), row, &batch);
  }
  return batch;
}

void Dataset::FillRow(int64_t offset, int row, TokenBatch* batch) const {
  const uint16_t* window = tokens_->data() + offset;
  int32_t* inputs = batch->inputs.data() + static_cast<size_t>(row) * seq_len_;
  int32_t* targets = batch->targets.data() + static_cast<size_t>(row) * seq_len_;
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = window[t];
    targets[t] = window[t + 1];
  }
}

}  // namespace pipetrain
