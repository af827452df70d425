#include "kernels/cuda/nccl_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pipetrain {

const char* NcclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult(unknown)";
  }
}

absl::Status NcclStatus(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                     NcclResultName(result), " (", ncclGetErrorString(result), ")");
  // The last warning is process state, not tied to `result`; it names the
  // cause (e.g. "Duplicate GPU detected") far better than the result does.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, "; NCCL says: ", last);
  return absl::InternalError(message);
}

}  // namespace pipetrain
