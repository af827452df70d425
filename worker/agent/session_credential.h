// SessionCredential: the worker's current session credential from the
// coordinator (coordinator.proto RegisterWorkerResponse.session_token).
// The agent sets it at every registration and attaches it to its calls; the
// worker's WorkerControlService accepts a call only when the caller
// presents an HMAC of it (WorkerControlCredential, common/secrets.h), which
// only the coordinator (and this worker) can make; the credential itself
// is refused (it must not cross the plaintext data-plane port).
// Thread-safe.
#ifndef PIPETRAIN_WORKER_AGENT_SESSION_CREDENTIAL_H_
#define PIPETRAIN_WORKER_AGENT_SESSION_CREDENTIAL_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class SessionCredential {
 public:
  void Set(std::string token);
  // "" before the first registration.
  std::string Get() const;
  // `authorization`: a call's "authorization" value. OK when it is "Bearer
  // <WorkerControlCredential(the current credential)>" (common/secrets.h:
  // the credential itself does not cross the unencrypted data-plane port);
  // UNAUTHENTICATED otherwise, the credential itself included (also before
  // any registration, when there is no credential to match).
  absl::Status Check(absl::string_view authorization) const;

 private:
  mutable AnnotatedMutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_SESSION_CREDENTIAL_H_
