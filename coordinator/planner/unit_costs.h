// Per-unit costs the solvers balance. Until workers profile the model (the
// planner issue), costs are analytic: FLOPs of each unit's forward and
// backward pass per micro-batch, which rank units correctly for a GEMM-bound
// CPU or GPU even if they are not seconds.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_UNIT_COSTS_H_
#define PIPETRAIN_COORDINATOR_PLANNER_UNIT_COSTS_H_

#include <string>
#include <vector>

#include "worker/model/gpt_config.h"

namespace pipetrain {

struct UnitCost {
  std::string name;
  double forward = 0;   // cost of the forward pass of one micro-batch
  double backward = 0;  // cost of its backward pass
  // Seconds of both passes that a worker's speed does not divide (a
  // tensor-parallel rank's exposed all-reduces, UnitProfile's
  // fwd_comm_seconds + bwd_comm_seconds); 0 for analytic costs.
  double comm_seconds = 0;
  double total() const { return forward + backward; }  // the compute only
};

// FLOPs per micro-batch of `micro_batch_size` sequences of `seq_len` tokens:
// matmuls count 2*m*n*k; attention adds QK^T and PV (4*T^2*d per sequence);
// backward is twice forward (dX and dW GEMMs). The embedding lookup does no
// matmul work; it is charged one FLOP per element written so it is not free.
std::vector<UnitCost> AnalyticUnitCosts(const GptConfig& config, int seq_len,
                                        int micro_batch_size);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_UNIT_COSTS_H_
