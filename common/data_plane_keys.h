// Data-plane keys: what the coordinator gives each worker of a plan so that
// it can prove the streams it sends and check the streams sent to it, and
// nothing more (docs/operations.md "Credentials and what each allows").
//
// The coordinator draws a random plan secret S for each plan and never
// sends it. With J the plan's data-plane job id (DataPlaneJobId: the job id
// and plan version) and workers numbered 0..n-1 as the data plane numbers
// them (replica, stage, tensor rank; worker/agent GlobalWorkerIndex):
//
//   receive key of worker b:   R_b   = HMAC-SHA256(S,   "pipetrain-dataplane-v2-receive|J|b")
//   link key from a to b:      L_a,b = HMAC-SHA256(R_b, "pipetrain-dataplane-v2-link|J|a")
//
// each as 64 lowercase hex digits (the hex text is the next HMAC's key).
// Worker w is given R_w and L_w,b for every b. So it proves any stream it
// sends (to b: with L_w,b), and checks any stream sent to it (it derives
// L_a,w from R_w); but a stream from a third worker a to b needs L_a,b,
// which only a, b and the coordinator can compute: a worker of the job can
// no longer speak for another one (under the v1 scheme every worker held
// S itself, and could).
//
// Thread-safe (pure functions).
#ifndef PIPETRAIN_COMMON_DATA_PLANE_KEYS_H_
#define PIPETRAIN_COMMON_DATA_PLANE_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pipetrain {

// Every key above is this long (hex digits of an HMAC-SHA256).
inline constexpr size_t kDataPlaneKeyBytes = 64;

// The job id the data plane uses for one plan of a job: "<job>/<version>".
// Streams and frames of an older plan name another one, so they are told
// apart from the new plan's even where the same workers run both.
std::string DataPlaneJobId(absl::string_view job_id, int64_t plan_version);

// R_b and L_a,b above.
std::string DataPlaneReceiveKey(absl::string_view plan_secret, absl::string_view data_plane_job,
                                int receiver);
std::string DataPlaneLinkKey(absl::string_view receive_key, absl::string_view data_plane_job,
                             int sender);

// What worker `worker` of `num_workers` gets (Assignment.data_plane_receive_key
// and .data_plane_send_keys).
struct DataPlaneKeys {
  std::string receive_key;             // R_worker
  std::vector<std::string> send_keys;  // [b]: L_worker,b for b in [0, num_workers)
};

// Every worker's keys of a plan, [w] for worker w: n receive keys and n^2
// link keys (about 2 s of HMACs for the largest job, kMaxStages workers).
// Requires num_workers >= 0 and a non-empty secret (checked).
std::vector<DataPlaneKeys> DeriveDataPlaneKeys(absl::string_view plan_secret,
                                               absl::string_view data_plane_job, int num_workers);

// Worker `worker`'s keys alone, DeriveDataPlaneKeys(...)[worker], in 2n
// HMACs rather than n^2 (tests that build one worker's assignment).
// Requires 0 <= worker < num_workers and a non-empty secret (checked).
DataPlaneKeys DeriveWorkerDataPlaneKeys(absl::string_view plan_secret,
                                        absl::string_view data_plane_job, int worker,
                                        int num_workers);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_DATA_PLANE_KEYS_H_
