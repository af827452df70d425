// A backend's practical GEMM ceiling: the best of a few timed square fp32
// GEMMs (through the backend's own Sgemm, so cuBLAS in its GEMM mode on
// CUDA, OpenBLAS with its thread count on the CPU). Used for the worker's
// registration facts and as the reference of the training-step benchmark.
#ifndef PIPETRAIN_WORKER_MODEL_GEMM_PROBE_H_
#define PIPETRAIN_WORKER_MODEL_GEMM_PROBE_H_

#include "worker/model/backend.h"

namespace pipetrain {

// GFLOP/s (2 n^3 per GEMM) of the fastest of `reps` n x n x n GEMMs on
// `backend`, on N(0, 1) inputs, after untimed warm-up GEMMs: at least one,
// and more until `warmup_seconds` have passed (a GPU's clocks ramp up under
// load; a single warm-up can leave the ceiling low). Each GEMM is timed
// from its call to the backend's Synchronize. Requires n >= 1, reps >= 1.
// 0 if the backend reports an error.
double MeasureGemmGflops(Backend* backend, int n, int reps, double warmup_seconds = 0);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_GEMM_PROBE_H_
