// Gradient clipping by the global L2 norm (TrainConfig.grad_clip), computed
// so that train-local and any pipeline plan on the same kind of backend get
// bitwise the same result: each parameter's sum of squares is taken alone,
// in double, in an order fixed by its size (ParameterSquares; element
// order on the CPU, a fixed tree on a GPU: Backend::SumsOfSquares); the
// total is those sums added in the model's parameter order
// (GptModel::parameters(): unit order, the tied embedding once) in double.
// A pipeline stage computes its parameters' sums, the stages exchange
// them, and each adds all of them in that same order. Then, as
// torch.nn.utils.clip_grad_norm_: with norm = sqrt(total), every gradient
// is multiplied by max_norm / (norm + 1e-6) when that is below 1. Unlike
// torch, a NaN norm leaves the gradients as they are (torch multiplies
// every one by NaN); the step's NaN loss is what the divergence check
// (divergence.h) then stops the job on. On a GPU both passes stay on the
// device; the host waits once, for the sums.
#ifndef PIPETRAIN_WORKER_TRAIN_GRAD_CLIP_H_
#define PIPETRAIN_WORKER_TRAIN_GRAD_CLIP_H_

#include <vector>

#include "worker/model/backend.h"
#include "worker/model/unit.h"

namespace pipetrain {

// Sum of the squares of `p`'s gradient, in double (Backend::SumsOfSquares:
// element order on the CPU, a fixed tree on a GPU).
double ParameterSquares(Backend* backend, const Parameter& p);

// ParameterSquares of each parameter, in the order given, in one backend
// call (a device backend waits once, not once per parameter).
std::vector<double> ParametersSquares(Backend* backend,
                                      const std::vector<const Parameter*>& params);

// The factor to multiply gradients by (1 when no clipping is needed).
float ClipScale(double total_squares, float max_norm);

// grad *= scale for each parameter (nothing when scale == 1), on the
// parameters' device (Backend::ScaleInPlace).
void ScaleGradients(Backend* backend, const std::vector<Parameter*>& params, float scale);

// Clipping when every parameter is here (train-local, the benchmarks): the
// total of ParametersSquares added in `params` order, then ScaleGradients
// by ClipScale. Returns the scale applied. max_norm <= 0: nothing is done.
float ClipGradientsByGlobalNorm(Backend* backend, const std::vector<Parameter*>& params,
                                float max_norm);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_GRAD_CLIP_H_
