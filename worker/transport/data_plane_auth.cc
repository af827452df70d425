#include "worker/transport/data_plane_auth.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/data_plane_keys.h"
#include "common/secrets.h"

namespace pipetrain {

std::string StreamProof(absl::string_view link_key, absl::string_view job_id, int source) {
  return HmacSha256Hex(link_key, absl::StrCat("pipetrain-dataplane-v2|", job_id, "|", source));
}

absl::StatusOr<int> VerifyStreamOpen(absl::string_view job_id, int num_stages,
                                     absl::string_view receive_key, absl::string_view sent_job,
                                     absl::string_view sent_stage, absl::string_view sent_proof) {
  if (sent_job.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("data-plane stream without credentials (",
                                                   kJobMetadataKey,
                                                   "); only the job's workers may send frames"));
  }
  if (job_id.empty()) {
    return absl::FailedPreconditionError("this worker runs no job; it accepts no frames");
  }
  // Answered to a caller not yet authenticated: the job this worker runs
  // (its id, its stages) is never named. Whether the id the caller named is
  // that job does show (this answer, or the proof's below): job ids are no
  // secret, and a sender of a plan that ended needs this answer to say why.
  if (sent_job != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("stream for job \"", absl::CHexEscape(sent_job.substr(0, 64)),
                     "\", which this worker does not run (a plan that ended?)"));
  }
  // Only the canonical decimal (what senders write): SimpleAtoi alone also
  // takes " 2", "+2" and "02".
  int stage = -1;
  if (!absl::SimpleAtoi(sent_stage, &stage) || stage < 0 || stage >= num_stages ||
      sent_stage != absl::StrCat(stage)) {
    return absl::UnauthenticatedError(
        absl::StrCat("data-plane stream without a valid ", kStageMetadataKey));
  }
  if (!receive_key.empty() &&
      !ConstantTimeEquals(
          sent_proof, StreamProof(DataPlaneLinkKey(receive_key, job_id, stage), job_id, stage))) {
    return absl::UnauthenticatedError(
        absl::StrCat("data-plane stream claiming stage ", stage, " of job ", job_id,
                     " without its proof; only that worker of the job may send as it"));
  }
  return stage;
}

}  // namespace pipetrain
