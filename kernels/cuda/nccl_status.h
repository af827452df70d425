// NCCL results as absl::Status, and the macro that checks them.
//
// Every NCCL call in kernels/cuda goes through NCCL_RETURN_IF_ERROR, like
// CUDA_RETURN_IF_ERROR for the runtime (cuda_status.h):
//
//   NCCL_RETURN_IF_ERROR(ncclGroupStart());
//
// The macro returns from the enclosing function, which must return
// absl::Status (or absl::StatusOr<T>). All functions are thread-safe.
#ifndef PIPETRAIN_KERNELS_CUDA_NCCL_STATUS_H_
#define PIPETRAIN_KERNELS_CUDA_NCCL_STATUS_H_

#include <nccl.h>

#include "absl/status/status.h"

namespace pipetrain {

// The enumerator's name, e.g. "ncclInvalidUsage"; "ncclResult(unknown)" for a
// value this header does not know (a newer library).
const char* NcclResultName(ncclResult_t result);

// OK for ncclSuccess; otherwise INTERNAL with `call` (the expression),
// file:line, the result's name, ncclGetErrorString, and NCCL's last warning
// (ncclGetLastError) when it has one, e.g.
//   "ncclCommInitRank(...) failed at kernels/cuda/nccl_comm.cc:80:
//    ncclInvalidUsage (invalid usage ...); NCCL says: Duplicate GPU detected ..."
// NCCL's detailed log goes to stderr with NCCL_DEBUG=WARN (or INFO).
absl::Status NcclStatus(ncclResult_t result, const char* call, const char* file, int line);

}  // namespace pipetrain

// Evaluates an ncclResult_t expression once; returns its INTERNAL status on failure.
#define NCCL_RETURN_IF_ERROR(call)                                                               \
  do {                                                                                           \
    ::absl::Status pt_nccl_status_ = ::pipetrain::NcclStatus((call), #call, __FILE__, __LINE__); \
    if (!pt_nccl_status_.ok()) return pt_nccl_status_;                                           \
  } while (0)

#endif  // PIPETRAIN_KERNELS_CUDA_NCCL_STATUS_H_
