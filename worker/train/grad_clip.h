// Gradient clipping by the global L2 norm (TrainConfig.grad_clip), computed
// so that train-local and any pipeline plan get bitwise the same result:
// each parameter's sum of squares is taken alone, in double, in element
// order (ParameterSquares); the total is those sums added in the model's
// parameter order (GptModel::parameters(): unit order, the tied embedding
// once) in double. A pipeline stage computes its parameters' sums, the
// stages exchange them, and each adds all of them in that same order.
// Then, as torch.nn.utils.clip_grad_norm_: with norm = sqrt(total), every
// gradient is multiplied by max_norm / (norm + 1e-6) when that is below 1.
#ifndef PIPETRAIN_WORKER_TRAIN_GRAD_CLIP_H_
#define PIPETRAIN_WORKER_TRAIN_GRAD_CLIP_H_

#include <vector>

#include "worker/model/backend.h"
#include "worker/model/unit.h"

namespace pipetrain {

// Sum of the squares of `p`'s gradient, in double, element order.
double ParameterSquares(Backend* backend, const Parameter& p);

// The factor to multiply gradients by (1 when no clipping is needed).
float ClipScale(double total_squares, float max_norm);

// grad *= scale for each parameter (nothing when scale == 1).
void ScaleGradients(Backend* backend, const std::vector<Parameter*>& params, float scale);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_GRAD_CLIP_H_
