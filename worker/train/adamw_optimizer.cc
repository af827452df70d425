#include "worker/train/adamw_optimizer.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

const char* DecayPolicyName(DecayPolicy policy) {
  return policy == DecayPolicy::kAll ? "all" : "matrices";
}

absl::Status ParseDecayPolicy(const std::string& text, DecayPolicy* out) {
  if (text == "matrices") {
    *out = DecayPolicy::kMatricesOnly;
  } else if (text == "all") {
    *out = DecayPolicy::kAll;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("weight decay policy must be 'matrices' or 'all', got '", text, "'"));
  }
  return absl::OkStatus();
}

void AdamWOptimizer::Step(const std::vector<Parameter*>& params) {
  ++steps_taken_;
  std::vector<AdamWTensor> tensors;
  tensors.reserve(params.size());
  for (Parameter* p : params) {
    auto it = moments_.find(p->name);
    if (it == moments_.end()) {
      it = moments_
               .emplace(p->name, AdamWMoments{backend_->Zeros(p->value.shape()),
                                              backend_->Zeros(p->value.shape())})
               .first;
    }
    const bool decay = decay_ == DecayPolicy::kAll || p->is_matrix;
    tensors.push_back({p->value.data(), p->grad.data(), it->second.m.data(), it->second.v.data(),
                       p->value.numel(), decay});
  }
  // All at once: on a GPU a few launches instead of one per tensor.
  backend_->AdamWUpdateAll(tensors, steps_taken_, config_);
}

}  // namespace pipetrain
