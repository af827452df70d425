// Paged lists and Job views for the Coordinator's read methods, shared by
// the gRPC and REST adapters (the logic is here, neither transport).
//
// Page tokens are opaque to clients (page_cursor.h: where the next page
// starts, also when items were removed meanwhile). Bounds (checked before
// use; docs/api.md "Paging"): page_size in [0, 1000] (0: kDefaultPageSize;
// above kMaxPageSize reads as kMaxPageSize; negative is INVALID_ARGUMENT;
// jobs in the full view: at most kMaxFullViewPageSize a page; any page at
// most kMaxPageBytes),
// page_token at most kMaxPageTokenBytes. Errors name the
// field ("page_size: ...", "page_token: ...", "view: ..."), so they carry a
// google.rpc.BadRequest violation (common/rpc_status.h).
// Thread-safe: reads the thread-safe registry and job manager.
#ifndef PIPETRAIN_COORDINATOR_API_LIST_PAGES_H_
#define PIPETRAIN_COORDINATOR_API_LIST_PAGES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "coordinator/api/page_cursor.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

inline constexpr int kDefaultPageSize = 100;
inline constexpr int kMaxPageSize = 1000;
// A page of jobs in the full view holds at most this many: each may carry
// 10000 losses (some 110 KB of JSON), and 1000 of them made one response
// of about 110 MB, held per connection until read.
inline constexpr int kMaxFullViewPageSize = 20;
// A page also ends before the item that would take it past this many bytes
// (the first item whatever its size; the next page starts there), so a
// client with gRPC's default 4 MiB receive limit can read every page: a
// job may carry 512 KiB of checkpoint lists and 128 KiB of plan history.
inline constexpr int64_t kMaxPageBytes = int64_t{3} << 20;

// How the items' bytes are counted against the page's budget: as the
// response will be sent. gRPC sends protobuf; REST sends JSON, which takes
// up to some 3 times as many bytes for the same item (field names, quoted
// int64s, timestamps as text, floats in decimal).
enum class PageEncoding { kProtobuf, kJson };

// INVALID_ARGUMENT for page_size < 0, a malformed or foreign page_token, or
// an unknown view. `max_page_bytes`: kMaxPageBytes but in tests.
absl::StatusOr<v1::ListJobsResponse> ListJobsPage(const JobManager& jobs,
                                                  const v1::ListJobsRequest& request,
                                                  int64_t max_page_bytes = kMaxPageBytes,
                                                  PageEncoding encoding = PageEncoding::kProtobuf);
// Each worker's `drained` is the job manager's (JobManager::IsDrained).
absl::StatusOr<v1::ListWorkersResponse> ListWorkersPage(
    const WorkerRegistry& workers, const JobManager& jobs, const v1::ListWorkersRequest& request,
    int64_t max_page_bytes = kMaxPageBytes, PageEncoding encoding = PageEncoding::kProtobuf);

// GetJob with its view: NOT_FOUND for an unknown id; INVALID_ARGUMENT for an
// unknown view.
absl::StatusOr<v1::Job> GetJobInView(const JobManager& jobs, const v1::GetJobRequest& request);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_LIST_PAGES_H_
