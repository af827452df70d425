#include "coordinator/api/caller_auth.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/secrets.h"

namespace pipetrain {

CallerAuth::CallerAuth(std::string user_token, const WorkerRegistry* workers)
    : user_token_(std::move(user_token)), workers_(workers) {
  PT_CHECK(workers != nullptr);
}

absl::Status CallerAuth::CheckUser(absl::string_view authorization) const {
  if (user_token_.empty()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing credential: send \"authorization: Bearer <user token>\" (the coordinator's "
        "--user-token; the CLI reads it from --token-file or PIPETRAIN_TOKEN)");
  }
  if (!ConstantTimeEquals(BearerToken(authorization), user_token_)) {
    return absl::UnauthenticatedError(
        "user token rejected; use the coordinator's user token (its --user-token or "
        "--user-token-file)");
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerRegistry::SessionIdentity> CallerAuth::AuthenticateWorker(
    absl::string_view authorization) const {
  const absl::string_view token = BearerToken(authorization);
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "missing credential: worker calls carry \"authorization: Bearer <session token>\" "
        "from RegisterWorker; register first");
  }
  return workers_->AuthenticateSession(token);
}

bool CallerAuth::IsStaleWorkerSession(absl::string_view authorization) const {
  const absl::string_view token = BearerToken(authorization);
  return !token.empty() && workers_->IsStaleSession(token);
}

absl::StatusOr<WorkerRegistry::SessionIdentity> CallerAuth::CheckWorker(
    absl::string_view authorization, absl::string_view worker_id) const {
  absl::StatusOr<WorkerRegistry::SessionIdentity> who = AuthenticateWorker(authorization);
  if (!who.ok()) return who.status();
  absl::Status acts = CheckActsFor(*who, worker_id);
  if (!acts.ok()) return acts;
  return who;
}

absl::Status CallerAuth::CheckActsFor(const WorkerRegistry::SessionIdentity& session,
                                      absl::string_view worker_id) {
  if (session.worker_id == worker_id) return absl::OkStatus();
  // The claimed id is the client's: quoted, escaped and cut short.
  return absl::PermissionDeniedError(absl::StrCat("the session credential of ", session.worker_id,
                                                  " cannot act for worker \"",
                                                  absl::CHexEscape(worker_id.substr(0, 64)), "\""));
}

}  // namespace pipetrain
