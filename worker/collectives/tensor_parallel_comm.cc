#include "worker/collectives/tensor_parallel_comm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "kernels/compress/elem_topk_codec.h"
#include "kernels/compress/token_topk_codec.h"

namespace pipetrain {

std::vector<uint8_t> KeepTopTokensPerSample(const std::vector<float>& scores, int seq_len,
                                            double keep) {
  std::vector<uint8_t> kept(scores.size(), 0);
  const int64_t per_sample = TopKCount(keep, seq_len);
  for (size_t first = 0; first + seq_len <= scores.size(); first += seq_len) {
    const std::vector<double> sample(scores.begin() + first, scores.begin() + first + seq_len);
    const std::vector<bool> mask = SelectTokens(sample, per_sample);
    for (int t = 0; t < seq_len; ++t) kept[first + t] = mask[t] ? 1 : 0;
  }
  return kept;
}

void CollectivesTensorParallelComm::AllReduceSum(Tensor& data) {
  WaitAllReduce(StartAllReduceSum(data));
}

int CollectivesTensorParallelComm::Queue(std::unique_ptr<Pending> pending, Tensor& data) {
  const int ticket = next_ticket_++;
  Pending* p = pending.get();
  pending_[ticket] = std::move(pending);
  if (!status_.ok()) {
    AnnotatedMutexLock lock(&mu_);
    p->status = status_;
    p->done = true;
    return ticket;
  }
  const int tags = p->sparse && !p->mask_given ? 2 : 1;
  if (next_tag_ > tag_end_ - tags) {
    AnnotatedMutexLock lock(&mu_);
    p->status = absl::ResourceExhaustedError(absl::StrCat(
        eval_ ? "the validation pass after step " : "step ", iteration_,
        ": its tensor-parallel all-reduces outgrew their ", eval_ ? eval_tag_span_ : step_tag_span_,
        " tags; use fewer micro-batches per step",
        eval_ ? " or fewer spec.training.eval_windows" : "",
        ", fewer tensor_partitions, or fewer layers per stage"));
    p->done = true;
    return ticket;
  }
  ++all_reduces_;
  bytes_ += data.size_bytes();
  p->target = data;
  // On the CPU backend `host` is `data` itself and the sum lands in place.
  p->host = backend_->Download(data);
  if (p->sparse && !p->mask_given) p->score_tag = next_tag_++;
  const int tag = next_tag_++;
  executor_->Post([this, p, tag, iteration = iteration_] {
    const absl::Time start = MonotonicClock()->Now();
    const int64_t sent_before = collectives_->sent_bytes();
    absl::Status earlier;
    {
      AnnotatedMutexLock lock(&mu_);
      earlier = first_failure_;
    }
    absl::Status status =
        earlier.ok() ? (p->sparse ? SparseSum(p, iteration, tag)
                                  : collectives_->AllReduce(iteration, tag, p->host))
                     : absl::Status(earlier.code(),
                                    absl::StrCat("an earlier tensor-parallel all-reduce failed: ",
                                                 earlier.message()));
    AnnotatedMutexLock lock(&mu_);
    if (!status.ok() && first_failure_.ok()) first_failure_ = status;
    p->status = std::move(status);
    p->seconds = absl::ToDoubleSeconds(MonotonicClock()->Now() - start);
    p->wire_bytes = collectives_->sent_bytes() - sent_before;
    p->done = true;
  });
  return ticket;
}

int CollectivesTensorParallelComm::StartAllReduceSum(Tensor& data) {
  return Queue(std::make_unique<Pending>(), data);
}

int CollectivesTensorParallelComm::StartTokenSparseSum(Tensor& data,
                                                       std::vector<float> local_scores, int seq_len,
                                                       std::vector<uint8_t>* kept) {
  if (!compresses()) return TensorParallelComm::StartTokenSparseSum(data, {}, seq_len, kept);
  auto p = std::make_unique<Pending>();
  p->sparse = true;
  p->scores = std::move(local_scores);
  p->seq_len = seq_len;
  p->kept_out = kept;
  return Queue(std::move(p), data);
}

int CollectivesTensorParallelComm::StartMaskedSum(Tensor& data, std::vector<uint8_t> kept) {
  if (!compresses()) return StartAllReduceSum(data);
  auto p = std::make_unique<Pending>();
  p->sparse = true;
  p->mask_given = true;
  p->kept = std::move(kept);
  return Queue(std::move(p), data);
}

// acctfm.txt §4.3: the scores' all-reduce and the top-k choice (4.3.1) when
// the rows are not given, then the kept rows' all-reduce through the codec
// (4.3.2); the dropped rows become 0 on every rank.
absl::Status CollectivesTensorParallelComm::SparseSum(Pending* p, int64_t iteration, int tag) {
  Tensor& data = p->host;
  const int64_t width = data.numel() == 0 ? 1 : data.shape().back();
  const int64_t rows = data.numel() / width;
  if (!p->mask_given) {
    if (p->seq_len < 1 || rows % p->seq_len != 0 ||
        static_cast<int64_t>(p->scores.size()) != rows) {
      return absl::InternalError(absl::StrCat("tensor-parallel token scores: ", p->scores.size(),
                                              " scores for ", rows, " rows of ", p->seq_len,
                                              " tokens per sample"));
    }
    Tensor scores = Tensor::FromVector({rows}, p->scores);
    RETURN_IF_ERROR(collectives_->AllReduce(iteration, p->score_tag, scores));
    // The top-k choice orders the scores: NaN has no place in that order
    // (the token codec refuses such scores too, CheckTokenTopKScores).
    const float* summed = scores.data();
    for (int64_t r = 0; r < rows; ++r) {
      if (!std::isfinite(summed[r])) {
        return absl::DataLossError(absl::StrCat(
            "tensor-parallel token scores summed over the group: row ", r, " is ", summed[r],
            " (a peer's scores, or this rank's activations, are not finite)"));
      }
    }
    p->kept = KeepTopTokensPerSample(scores.ToVector(), p->seq_len, compression_.keep);
  } else if (static_cast<int64_t>(p->kept.size()) != rows) {
    return absl::InternalError(absl::StrCat("tensor-parallel token mask of ", p->kept.size(),
                                            " rows for a tensor of ", rows));
  }
  const int64_t kept_rows = std::count(p->kept.begin(), p->kept.end(), 1);
  Tensor compact = Tensor::Uninitialized({std::max<int64_t>(kept_rows, 1), width});
  float* values = data.data();
  int64_t next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = values + r * width;
    if (p->kept[r]) {
      std::memcpy(compact.data() + next++ * width, row, static_cast<size_t>(width) * sizeof(float));
      continue;
    }
    for (int64_t i = 0; i < width; ++i) {
      const double v = row[i];
      p->norm_squared += v * v;
      p->error_squared += v * v;  // a dropped row is all error
      row[i] = 0;
    }
  }
  if (kept_rows == 0) return absl::OkStatus();
  if (compression_.codec != nullptr) {
    Collectives::EncodedStats stats;
    RETURN_IF_ERROR(collectives_->AllReduceEncoded(iteration, tag, *compression_.codec, kept_rows,
                                                   compact, &stats));
    p->norm_squared += stats.norm_squared;
    p->error_squared += stats.error_squared;
  } else {
    for (int64_t i = 0; i < compact.numel(); ++i) {
      p->norm_squared += static_cast<double>(compact.data()[i]) * compact.data()[i];
    }
    RETURN_IF_ERROR(collectives_->AllReduce(iteration, tag, compact));
  }
  next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (!p->kept[r]) continue;
    std::memcpy(values + r * width, compact.data() + next++ * width,
                static_cast<size_t>(width) * sizeof(float));
  }
  return absl::OkStatus();
}

void CollectivesTensorParallelComm::WaitAllReduce(int ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return;
  Pending& p = *it->second;
  const absl::Time start = MonotonicClock()->Now();
  {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&p] { return p.done; }, absl::InfiniteDuration());
  }
  waited_seconds_ += absl::ToDoubleSeconds(MonotonicClock()->Now() - start);
  seconds_ += p.seconds;
  wire_bytes_ += p.wire_bytes;
  if (p.sparse) {
    compressed_bytes_ += p.target.size_bytes();
    compressed_wire_bytes_ += p.wire_bytes;
  }
  norm_squared_ += p.norm_squared;
  error_squared_ += p.error_squared;
  if (!p.status.ok()) {
    // The first failure waited sticks: a follower's carries the first
    // background failure's code and words (first_failure_).
    if (status_.ok()) status_ = p.status;
  } else {
    if (status_.ok() && p.host.data() != p.target.data()) {
      backend_->CopyFromHost(p.host, &p.target);
    }
    if (p.kept_out != nullptr) *p.kept_out = std::move(p.kept);
  }
  pending_.erase(it);
}

}  // namespace pipetrain
