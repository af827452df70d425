// The CPU backend: host tensors and the kernels/cpu ops, i.e. exactly what
// the units computed before backends existed (bitwise; the pipeline and
// cluster equivalence tests pin it). One process-wide instance, safe to
// share between threads (it holds only the op-timing switch and totals).
#ifndef PIPETRAIN_WORKER_MODEL_CPU_BACKEND_H_
#define PIPETRAIN_WORKER_MODEL_CPU_BACKEND_H_

#include "worker/model/backend.h"

namespace pipetrain {

// The process-wide CPU backend (never null, never destroyed).
Backend* CpuBackend();

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_CPU_BACKEND_H_
