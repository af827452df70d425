// Who may send a worker tensor frames (docs/operations.md "Security").
//
// The coordinator gives every worker of a plan its own data-plane keys
// (common/data_plane_keys.h): a receive key, and one link key per worker it
// may send to (Assignment.data_plane_receive_key, .data_plane_send_keys).
// A sender, worker a, opens each DataPlane/Stream to worker b with three
// metadata entries:
//
//   x-pipetrain-job    the data-plane job id ("<job>/<plan version>")
//   x-pipetrain-stage  a, its worker index (decimal, as absl::StrCat writes
//                      it: no sign, space or leading zero)
//   x-pipetrain-proof  HMAC-SHA256(L_a,b, "pipetrain-dataplane-v2|<job>|<a>"), hex
//
// (L_a,b binds the receiver: a's proof to b does not open a stream to c.)
//
// The receiver accepts the stream only for the job it runs, a worker of
// that job, and the proof it computes itself from its receive key
// (compared in constant time); the stream is then bound to that job and
// sender, and every frame on it must say the same. A process that is not
// one of the job's workers has no key, so it cannot open a stream; a worker
// of the job can open streams only as itself: the link key of another
// sender to this receiver is known to those two and the coordinator alone.
// The proof is not a MAC of the frames and carries no nonce: on a network
// where others can read or change traffic, run the data plane inside a
// private network (the threat model in docs/operations.md).
//
// Thread-safe (pure functions).
#ifndef PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_AUTH_H_
#define PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_AUTH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

inline constexpr char kJobMetadataKey[] = "x-pipetrain-job";
inline constexpr char kStageMetadataKey[] = "x-pipetrain-stage";
inline constexpr char kProofMetadataKey[] = "x-pipetrain-proof";

// What a sender needs to open streams for a job.
struct JobCredential {
  std::string job_id;
  // [b]: this worker's link key to worker b. Empty: send no proof (only a
  // receiver without a receive key, in tests, accepts that).
  std::vector<std::string> send_keys;
};

// The proof that `link_key` (L_source,b) gives a stream of the job from
// `source` to the receiver b the key was made for.
std::string StreamProof(absl::string_view link_key, absl::string_view job_id, int source);

// The receiver's check of a stream's metadata values (absent ones are "").
// `job_id`/`num_stages`: the job this worker runs now (num_stages: the
// number of its workers); `receive_key`: this worker's receive key. An empty `receive_key` accepts
// any worker of that job without a proof (in-process tests only: the
// worker agent refuses assignments without keys).
// Returns the sender's index. Errors: UNAUTHENTICATED without a job entry;
// FAILED_PRECONDITION when this worker runs no job or another one (the
// sender is out of step; the message names only the job the caller sent,
// never this worker's: the caller is not yet authenticated); UNAUTHENTICATED for a
// missing or malformed stage, or a proof that does not match.
absl::StatusOr<int> VerifyStreamOpen(absl::string_view job_id, int num_stages,
                                     absl::string_view receive_key, absl::string_view sent_job,
                                     absl::string_view sent_stage, absl::string_view sent_proof);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_AUTH_H_
