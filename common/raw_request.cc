#include "common/raw_request.h"

namespace pipetrain {

absl::Status CheckRequestBytes(absl::string_view method, size_t bytes, size_t max_bytes) {
  if (bytes <= max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(method, ": a request of ", bytes,
                                                   " bytes is over this method's limit of ",
                                                   max_bytes, " bytes"));
}

}  // namespace pipetrain
