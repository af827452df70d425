#include "worker/agent/session_credential.h"

#include <utility>

#include "common/secrets.h"

namespace pipetrain {

void SessionCredential::Set(std::string token) {
  AnnotatedMutexLock lock(&mu_);
  token_ = std::move(token);
}

std::string SessionCredential::Get() const {
  AnnotatedMutexLock lock(&mu_);
  return token_;
}

absl::Status SessionCredential::Check(absl::string_view authorization) const {
  const std::string current = Get();
  if (!current.empty() &&
      ConstantTimeEquals(BearerToken(authorization), WorkerControlCredential(current))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "WorkerControl is for this worker's coordinator only: present WorkerControlCredential "
      "of the worker's current session credential as \"authorization: Bearer <token>\"");
}

}  // namespace pipetrain
