// StageRuntime: executes one stage's program (DESIGN.md §5) iteration by
// iteration — the worker's interpreter.
//
// It builds and initialises the units it owns exactly as GptModel would
// (same Philox keys), keeps one saved-tensor context per micro-batch in
// flight, talks to other stages only through a Transport, and owns the
// AdamW state of its units. With lossless transport the pipeline's losses
// and weights equal LocalTrainer's bitwise (pipeline_equivalence_test).
//
// Not thread-safe, except current_instruction(), which any thread may read.
#ifndef PIPETRAIN_WORKER_RUNTIME_STAGE_RUNTIME_H_
#define PIPETRAIN_WORKER_RUNTIME_STAGE_RUNTIME_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/data/dataset.h"
#include "worker/model/unit.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/train/train_config.h"
#include "worker/transport/transport.h"

namespace pipetrain {

struct StageSetup {
  std::string job_id;
  TrainConfig train;       // model shape, batch, micro-batches, AdamW, seed
  int stage = 0;
  int num_stages = 1;
  int first_unit = 0;      // owned units [first_unit, end_unit)
  int end_unit = 0;
  v1::Program program;     // one iteration
  absl::Duration recv_timeout = absl::Seconds(60);
};

struct IterationResult {
  int64_t iteration = 0;
  std::vector<float> micro_batch_losses;  // filled on the stage that owns head
  double busy_seconds = 0;   // everything but waiting in receives
  double idle_seconds = 0;   // waiting in receives (the pipeline bubble)
  // Busy time by phase: "forward", "backward", "send", "optimizer", "tied".
  std::map<std::string, double> phase_seconds;
  // Bytes handed to the transport, by (peer stage, tensor kind name).
  std::map<std::pair<int, std::string>, int64_t> sent_bytes;
};

class StageRuntime {
 public:
  // INVALID_ARGUMENT when the setup is inconsistent (unit range outside the
  // model, config invalid). `dataset` (must outlive the runtime) is needed by
  // stages owning embed or head; `transport` by stages with peers.
  static absl::StatusOr<std::unique_ptr<StageRuntime>> Create(const StageSetup& setup,
                                                              const Dataset* dataset,
                                                              Transport* transport);

  // Runs the program once for `iteration`. Errors carry the failing
  // instruction: DEADLINE_EXCEEDED from a receive names the peer and tensor;
  // INTERNAL for program errors (e.g. a backward without its forward).
  absl::StatusOr<IterationResult> RunIteration(int64_t iteration);

  // Owned parameters, each once (a stage owning embed and head lists wte once).
  std::vector<Parameter*> parameters() const;
  AdamWOptimizer& optimizer() { return optimizer_; }
  // What the runtime is doing now, e.g. "recv ACTIVATION unit 3 mb 1 from stage 0".
  std::string current_instruction() const;

 private:
  StageRuntime(const StageSetup& setup, const Dataset* dataset, Transport* transport);
  absl::Status Execute(const v1::Instruction& in, int64_t iteration, IterationResult* result);
  absl::Status Forward(const v1::Instruction::Forward& f);
  absl::Status Backward(const v1::Instruction::Backward& b);
  absl::Status Send(const v1::Instruction::Send& s, int64_t iteration, IterationResult* result);
  absl::Status Recv(const v1::Instruction::Recv& r, int64_t iteration);
  absl::Status AddTied();
  Unit* OwnedUnit(int index);
  TokenBatch BatchFor(int micro_batch) const;
  Parameter* TiedHolder();  // the wte Parameter whose gradient this stage sends

  StageSetup setup_;
  const Dataset* dataset_;
  Transport* transport_;
  std::vector<std::unique_ptr<Unit>> units_;  // index - first_unit
  AdamWOptimizer optimizer_;
  int64_t iteration_ = 0;
  // Per micro-batch state within an iteration.
  std::map<int, Tensor> inputs_;          // received activations
  std::map<int, Tensor> outputs_;         // forward outputs to send
  std::map<int, Tensor> grads_in_;        // received activation gradients
  std::map<int, Tensor> grads_out_;       // backward results to send
  std::map<int, std::vector<UnitContext>> contexts_;
  std::map<int, float> losses_;
  Tensor tied_received_;
  mutable AnnotatedMutex status_mu_;
  std::string current_ ABSL_GUARDED_BY(status_mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_STAGE_RUNTIME_H_
