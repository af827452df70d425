// TensorParallelComm (worker/model/tensor_parallel.h) on Collectives: the
// all-reduces of a tensor-parallel unit group run over the data plane as
// deterministic ring / recursive-doubling all-reduces, so every rank gets
// bitwise the same sum.
//
// Message addressing: the collectives of one step are told apart by a tag
// that counts up from kTensorParallelTagBase, reset by BeginIteration: the
// ranks run the same units in the same order, so the n-th all-reduce of a
// step has the same tag on every rank. Tensors on a device backend cross
// to the host and back (the CPU backend's are summed in place).
//
// Overlap: StartAllReduceSum hands the sum to one background thread, which
// runs the group's all-reduces in Start order (the Collectives object is
// used by that thread only); the device copies stay on the caller's thread
// (at Start and at Wait). After a failed all-reduce the later ones are
// skipped; the error shows in status() once its ticket is waited for.
//
// Hybrid compression (acctfm.txt §4.3, TensorParallelCompression): the
// token-sparse sums all-reduce the token scores (fp32, B x T values), keep
// each sample's top tokens, and all-reduce the kept rows with
// Collectives::AllReduceEncoded (the codec's payloads on the wire), or as
// fp32 without a codec; a dropped row is 0 on every rank. The statistics
// count what this rank sent (wire_bytes) next to the fp32 size of what
// was reduced (bytes), and the squared error compression made.
//
// Not thread-safe: the thread driving the units calls it.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_COMM_H_
#define PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_COMM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/annotated_mutex.h"
#include "common/serial_executor.h"
#include "kernels/compress/codec.h"
#include "worker/collectives/collectives.h"
#include "worker/model/backend.h"
#include "worker/model/tensor_parallel.h"

namespace pipetrain {

// Tags at and above this are the tensor-parallel group's (below: the data-
// parallel and loss collectives of stage_runtime.cc).
inline constexpr int kTensorParallelTagBase = 1 << 23;

// The rows to keep (1) of `scores` (rows = samples x seq_len values, the
// group's summed token importance), per sample the TopKCount(keep, seq_len)
// of highest score, equal scores going to the lower row (acctfm.txt
// §4.3.1). Requires seq_len >= 1 dividing scores.size() and 0 < keep <= 1.
std::vector<uint8_t> KeepTopTokensPerSample(const std::vector<float>& scores, int seq_len,
                                            double keep);

class CollectivesTensorParallelComm : public TensorParallelComm {
 public:
  // `collectives` is the group in rank order (its rank() is this rank);
  // `backend` the units'. Both must outlive this.
  CollectivesTensorParallelComm(Collectives* collectives, Backend* backend,
                                TensorParallelCompression compression = {})
      : collectives_(collectives),
        backend_(backend),
        compression_(std::move(compression)),
        status_(collectives->status()) {}

  // Starts step `iteration`'s collectives (tags from the base again), or
  // with `eval` those of the validation pass after step `iteration` (tags
  // of their own, so that they never meet the step's).
  // A validation pass does not compress (compresses() is false until the
  // next step's BeginIteration): its loss is the model's, comparable with
  // train-local's and with the same job uncompressed, as the planner sends
  // validation activations raw too.
  void BeginIteration(int64_t iteration, bool eval = false) {
    iteration_ = iteration;
    // Tickets count from 0 again when none is outstanding (every pass waits
    // for its all-reduces): a count kept over the whole run passed INT_MAX
    // after about 90,000 steps of 48 layers, 4 partitions and 32
    // micro-batches (signed overflow).
    if (pending_.empty()) next_ticket_ = 0;
    next_tag_ = kTensorParallelTagBase + (eval ? kStepTagSpan : 0);
    tag_end_ = next_tag_ + (eval ? eval_tag_span_ : step_tag_span_);
    eval_ = eval;
  }

  // The tags a step's all-reduces may take from kTensorParallelTagBase, and
  // then a validation pass's; stage_runtime.cc places the tuning,
  // final-gather and checkpoint tags above both. An all-reduce past its
  // span fails (RESOURCE_EXHAUSTED) instead of taking another phase's tag,
  // whose message it could receive in place of its own.
  static constexpr int kStepTagSpan = 1 << 22;
  // GPT-2 124M's validation micro-batch takes 27 (a tag per layer's
  // attention and MLP, three more): 77,000 micro-batches.
  static constexpr int kEvalTagSpan = (1 << 21) - 1;
  // Tests: smaller spans, from the next BeginIteration.
  void SetTagSpansForTesting(int step, int eval) {
    step_tag_span_ = step;
    eval_tag_span_ = eval;
  }

  int rank() const override { return collectives_->rank(); }
  int size() const override { return collectives_->size(); }
  void AllReduceSum(Tensor& data) override;
  absl::Status status() const override { return status_; }
  int StartAllReduceSum(Tensor& data) override;
  void WaitAllReduce(int ticket) override;
  bool compresses() const override { return compression_.enabled() && !eval_; }
  int StartTokenSparseSum(Tensor& data, std::vector<float> local_scores, int seq_len,
                          std::vector<uint8_t>* kept) override;
  int StartMaskedSum(Tensor& data, std::vector<uint8_t> kept) override;
  // All-reduces run so far, the fp32 bytes they reduced (whole tensors,
  // dropped rows included), the bytes this rank's messages carried for them
  // (payloads when compressed, the token scores' all-reduce included), and
  // the seconds they took (for the metrics and tests).
  int64_t all_reduces() const { return all_reduces_; }
  int64_t bytes() const { return bytes_; }
  int64_t wire_bytes() const { return wire_bytes_; }
  // Of the compressed sums: the squared L2 norm of this rank's
  // contributions and of what compression took from them (the dropped
  // rows, and the codec's error on the kept ones).
  double compressed_norm_squared() const { return norm_squared_; }
  // Of the token-sparse sums only: their fp32 size and the bytes sent.
  int64_t compressed_bytes() const { return compressed_bytes_; }
  int64_t compressed_wire_bytes() const { return compressed_wire_bytes_; }
  double compression_error_squared() const { return error_squared_; }
  double seconds() const { return seconds_; }
  // The time the caller spent blocked in WaitAllReduce (and so in
  // AllReduceSum): what the partitions did not hide behind compute. It
  // includes a queued all-reduce's wait for the background thread, so it
  // can exceed seconds().
  double waited_seconds() const { return waited_seconds_; }

 private:
  // One started all-reduce. The background task sums `host` and then sets
  // status, seconds and done under mu_; the caller's Wait reads them (and
  // `host`) after seeing done under mu_, which orders the two threads (an
  // AnnotatedMutex, so that ThreadSanitizer sees it too).
  struct Pending {
    Tensor target;  // the caller's tensor
    Tensor host;    // its host copy (target itself on the CPU)
    // Token-sparse sums: the rows kept (given, or chosen from `scores`
    // summed under `score_tag`) and where the caller wants them.
    bool sparse = false;
    std::vector<float> scores;
    int seq_len = 0;
    int score_tag = -1;
    // Whether `kept` was given (StartMaskedSum): an empty `kept` is also a
    // given mask, that of a tensor of 0 rows, so emptiness cannot say it.
    bool mask_given = false;
    std::vector<uint8_t> kept;
    std::vector<uint8_t>* kept_out = nullptr;
    // Set by the background task:
    absl::Status status;
    double seconds = 0;
    int64_t wire_bytes = 0;
    double norm_squared = 0, error_squared = 0;
    bool done = false;
  };

  // The part of Start* they share: queues `p` (its host copy made) under
  // tag `tag`; returns its ticket.
  int Queue(std::unique_ptr<Pending> pending, Tensor& data);
  // Runs on the background thread: the token-sparse sum of p->host.
  absl::Status SparseSum(Pending* p, int64_t iteration, int tag);

  Collectives* const collectives_;
  Backend* const backend_;
  const TensorParallelCompression compression_;
  absl::Status status_;
  int64_t iteration_ = 0;
  int next_tag_ = kTensorParallelTagBase;
  int tag_end_ = kTensorParallelTagBase + kStepTagSpan;  // BeginIteration's span
  int step_tag_span_ = kStepTagSpan, eval_tag_span_ = kEvalTagSpan;
  bool eval_ = false;  // a validation pass's (BeginIteration)
  int64_t all_reduces_ = 0;
  int64_t bytes_ = 0;
  int64_t wire_bytes_ = 0;
  double norm_squared_ = 0, error_squared_ = 0;
  int64_t compressed_bytes_ = 0, compressed_wire_bytes_ = 0;
  double seconds_ = 0;
  double waited_seconds_ = 0;
  int next_ticket_ = 0;
  std::map<int, std::unique_ptr<Pending>> pending_;  // by ticket
  AnnotatedMutex mu_;  // guards each Pending's status, seconds and done
  // The first background all-reduce's failure: every later one fails with
  // it (its code and words), so that whichever ticket is waited first
  // tells the cause. A streamed unit's tickets may be waited after a later
  // one's (a token score's), and a follower's own ABORTED there read as a
  // lost peer: the job recovered, replayed the same failure, and failed
  // with no cause named.
  absl::Status first_failure_ ABSL_GUARDED_BY(mu_);
  // Last: destroyed first, running what is queued while pending_ exists.
  std::unique_ptr<SerialExecutor> executor_ = std::make_unique<SerialExecutor>();
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_TENSOR_PARALLEL_COMM_H_
