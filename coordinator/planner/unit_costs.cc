#include "coordinator/planner/unit_costs.h"

namespace pipetrain {

std::vector<UnitCost> AnalyticUnitCosts(const GptConfig& config, int seq_len,
                                        int micro_batch_size) {
  const double tokens = double(seq_len) * micro_batch_size;
  const double d = config.d_model;
  std::vector<UnitCost> costs;
  for (int i = 0; i < NumUnits(config); ++i) {
    double forward = 0;
    switch (UnitKindAt(config, i)) {
      case UnitKind::kEmbed: forward = tokens * d; break;
      case UnitKind::kAttention:
        forward = 2 * tokens * 4 * d * d + 4.0 * micro_batch_size * seq_len * seq_len * d;
        break;
      case UnitKind::kMlp: forward = 2 * tokens * 8 * d * d; break;
      case UnitKind::kHead: forward = 2 * tokens * d * config.vocab_size; break;
    }
    costs.push_back({UnitName(config, i), forward, 2 * forward});
  }
  return costs;
}

}  // namespace pipetrain
