// Who may send a worker tensor frames (docs/operations.md "Security").
//
// The coordinator gives every stage of a job the same random job secret
// (Assignment.data_plane_secret). A sender opens each DataPlane/Stream with
// three metadata entries:
//
//   x-pipetrain-job    the job id
//   x-pipetrain-stage  its stage (decimal, as absl::StrCat writes it: no sign,
//                      space or leading zero)
//   x-pipetrain-proof  HMAC-SHA256(secret, "pipetrain-dataplane-v1|<job>|<stage>"), hex
//
// The receiver accepts the stream only for the job it runs, a stage of that
// job, and the proof it computes itself (compared in constant time); the
// stream is then bound to that job and stage, and every frame on it must
// say the same. A process that is not one of the job's workers does not
// know the secret, so it cannot open a stream, let alone file a tensor.
// The proof is not a MAC of the frames: on a network where others can read
// or change traffic, run the data plane inside a private network (the
// threat model in docs/operations.md).
//
// Thread-safe (pure functions).
#ifndef PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_AUTH_H_
#define PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

inline constexpr char kJobMetadataKey[] = "x-pipetrain-job";
inline constexpr char kStageMetadataKey[] = "x-pipetrain-stage";
inline constexpr char kProofMetadataKey[] = "x-pipetrain-proof";

// What a sender needs to open streams for a job.
struct JobCredential {
  std::string job_id;
  std::string secret;  // empty: send no proof (only a receiver without one accepts)
};

// The proof for (job, source stage) under `secret`.
std::string StreamProof(absl::string_view secret, absl::string_view job_id, int source_stage);

// The receiver's check of a stream's metadata values (absent ones are "").
// `job_id`/`num_stages`/`secret`: the job this worker runs now; an empty
// `secret` accepts any stage of that job without a proof (in-process tests
// only: the worker agent refuses assignments without a secret).
// Returns the source stage. Errors: UNAUTHENTICATED without a job entry;
// FAILED_PRECONDITION when this worker runs no job or another one (the
// sender is out of step; the message names both); UNAUTHENTICATED for a
// missing or malformed stage, or a proof that does not match.
absl::StatusOr<int> VerifyStreamOpen(absl::string_view job_id, int num_stages,
                                     absl::string_view secret, absl::string_view sent_job,
                                     absl::string_view sent_stage, absl::string_view sent_proof);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_AUTH_H_
