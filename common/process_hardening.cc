#include "common/process_hardening.h"

#include <sys/prctl.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status ForbidCoreDumpsAndTracing() {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    return absl::InternalError(
        absl::StrCat("prctl(PR_SET_DUMPABLE, 0) failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool ProcessIsDumpable() { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1; }

}  // namespace pipetrain
