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

// TensorLayoutRequest::beta's "derive it from the machine" (the plan
// command's default for --distpar-beta).
inline constexpr double kCalibratedBeta = -1;

struct TensorLayoutRequest {
  int devices = 2;  // T >= 2
  // DistPar's weight of communication, >= 0; kCalibratedBeta:
  // CalibratedBeta from gflops and bandwidth_gbps when the bandwidth is
  // given, else 1.
  double beta = 1;
  int64_t tokens = 1024;  // micro-batch size x sequence length
  int64_t d_model = 768;
  double gflops = 100;        // the devices' GEMM rate, for a calibrated beta
  double bandwidth_gbps = 0;  // the link's, in Gbit/s; 0: not given
  // The sequences of the tokens and the attention heads, for the splits
  // that must keep them whole (LayoutProblem); 0: not constrained.
  int64_t samples = 0;
  int64_t heads = 0;
};

// The report as text (json = false) or JSON. INVALID_ARGUMENT naming the
// flag for T < 2, beta < 0 (other than kCalibratedBeta), non-positive
// dimensions, a calibration from a non-positive GEMM rate, or a d_model
// no job on T could cut: T must divide it (1-D), or T = p^3 and p^2
// divide it (3-D cube).
// The costs are distpar_layout.h's, computation summed over all T
// devices: not comparable with `plan --data auto`'s DistPar cost
// (DistParLayoutCost, a busiest-device figure).
absl::StatusOr<std::string> TensorLayoutReport(const TensorLayoutRequest& request, bool json);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_TENSOR_LAYOUT_REPORT_H_
