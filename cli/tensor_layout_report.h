// `pipetrain plan --tensor T`: DistPar's layout per linear layer of one
// GPT-2 block on a tensor-parallel group of T devices
// (coordinator/planner/distpar_layout.h), with the conversions it needs and
// its cost next to fixed schemes (Megatron's column-row, data, replicate,
// and the 3-D cube where T is one). Planner output only: jobs run Megatron's
// column-row layout whatever the search chooses.
#ifndef PIPETRAIN_CLI_TENSOR_LAYOUT_REPORT_H_
#define PIPETRAIN_CLI_TENSOR_LAYOUT_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

struct TensorLayoutRequest {
  int devices = 2;        // T >= 2
  double beta = 1;        // DistPar's weight of communication, >= 0
  int64_t tokens = 1024;  // micro-batch size x sequence length
  int64_t d_model = 768;
};

// The report as text (json = false) or JSON. INVALID_ARGUMENT naming the
// flag for T < 2, beta < 0, or non-positive dimensions.
absl::StatusOr<std::string> TensorLayoutReport(const TensorLayoutRequest& request, bool json);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_TENSOR_LAYOUT_REPORT_H_
