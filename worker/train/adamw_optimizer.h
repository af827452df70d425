// AdamW over a set of named parameters, with the moment buffers it owns.
//
// State is keyed by parameter name, so a pipeline worker that owns a subset
// of units keeps exactly the moments of its parameters, and checkpoints can
// store them per tensor. The moments live on the backend the parameters
// live on (given at construction; the update runs there). Not thread-safe.
#ifndef PIPETRAIN_WORKER_TRAIN_ADAMW_OPTIMIZER_H_
#define PIPETRAIN_WORKER_TRAIN_ADAMW_OPTIMIZER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/adamw.h"
#include "worker/model/unit.h"

namespace pipetrain {

// Which tensors weight decay applies to. GPT-2 practice (and the default)
// exempts biases and LayerNorm gains: decay only 2-D weights.
enum class DecayPolicy { kMatricesOnly, kAll };

// "matrices" | "all"; INVALID_ARGUMENT otherwise.
absl::Status ParseDecayPolicy(const std::string& text, DecayPolicy* out);
// The name ParseDecayPolicy takes for `policy`.
const char* DecayPolicyName(DecayPolicy policy);

struct AdamWMoments {
  Tensor m;
  Tensor v;
};

class AdamWOptimizer {
 public:
  // `backend` (not null, outliving the optimizer) holds the parameters.
  AdamWOptimizer(const AdamWConfig& config, DecayPolicy decay, Backend* backend = CpuBackend())
      : config_(config), decay_(decay), backend_(backend) {}

  // One update of every parameter from its accumulated gradient (gradients
  // are not cleared). Moments are created (zero) on first sight of a name.
  void Step(const std::vector<Parameter*>& params);

  int64_t steps_taken() const { return steps_taken_; }
  const AdamWConfig& config() const { return config_; }
  std::map<std::string, AdamWMoments>& moments() { return moments_; }
  const std::map<std::string, AdamWMoments>& moments() const { return moments_; }
  // For resuming: the number of updates already applied.
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  // The learning rate of the next Step (lr_schedule.h).
  void set_lr(float lr) { config_.lr = lr; }

 private:
  AdamWConfig config_;
  DecayPolicy decay_;
  Backend* backend_;
  int64_t steps_taken_ = 0;
  std::map<std::string, AdamWMoments> moments_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_ADAMW_OPTIMIZER_H_
