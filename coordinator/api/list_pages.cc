#include "coordinator/api/list_pages.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/api/page_cursor.h"
#include "google/protobuf/util/json_util.h"

namespace pipetrain {
namespace {

absl::StatusOr<int> PageSize(int32_t requested) {
  if (requested < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: must be 0 or more (above ",
                                                   kMaxPageSize, " reads as ", kMaxPageSize,
                                                   "), got ", requested));
  }
  if (requested == 0) return kDefaultPageSize;
  return std::min<int>(requested, kMaxPageSize);
}

// A worker's: the number of its id ("w-12"), the registry's order.
int64_t WorkerKey(const v1::Worker& worker) { return WorkerIdNumber(worker.id()).value_or(-1); }

// An item's bytes in the response as `encoding` writes it (JSON: the
// item's object and the comma after it in the list).
int64_t EncodedBytes(const google::protobuf::Message& item, PageEncoding encoding) {
  if (encoding == PageEncoding::kProtobuf) return static_cast<int64_t>(item.ByteSizeLong());
  std::string json;
  // As the REST adapter prints the whole response (default options). A
  // message that cannot be printed fails that response anyway; counted at
  // its protobuf size meanwhile.
  if (!google::protobuf::util::MessageToJsonString(item, &json).ok()) {
    return static_cast<int64_t>(item.ByteSizeLong());
  }
  return static_cast<int64_t>(json.size()) + 1;
}

// The page after `cursor` of the items `keyed` lists (list order), and the
// next token: at most `size` items, and no more than `max_bytes` of them in
// `encoding` (the first one whatever its size). `fetch(i)` gives item i as
// sent, or nullopt for one gone since `keyed` was read (skipped), so only
// the page's items are copied.
template <typename T, typename Fetch>
std::string Slice(const std::vector<PageItem>& keyed, absl::string_view list,
                  const PageCursor& cursor, int size, int64_t max_bytes, PageEncoding encoding,
                  Fetch fetch, std::vector<T>& page) {
  int64_t bytes = 0;
  size_t next = PageBegin(keyed, cursor);
  size_t last = next;
  for (; next < keyed.size() && page.size() < static_cast<size_t>(size); ++next) {
    std::optional<T> item = fetch(next);
    if (!item.has_value()) continue;
    const int64_t item_bytes = EncodedBytes(*item, encoding);
    if (!page.empty() && bytes + item_bytes > max_bytes) break;
    bytes += item_bytes;
    page.push_back(*std::move(item));
    last = next;
  }
  if (next >= keyed.size() || page.empty()) return "";
  return MakePageToken(list, PageCursor{cursor.position + page.size(), std::string(keyed[last].id),
                                        keyed[last].key});
}

absl::Status ApplyView(v1::JobView view, v1::Job& job) {
  switch (view) {
    case v1::JOB_VIEW_UNSPECIFIED:
    case v1::JOB_VIEW_BASIC:
      job.mutable_progress()->clear_loss_history();
      return absl::OkStatus();
    case v1::JOB_VIEW_FULL:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("view: unknown value ", static_cast<int>(view),
                                                     "; use JOB_VIEW_BASIC or JOB_VIEW_FULL"));
  }
}

}  // namespace

absl::StatusOr<v1::ListJobsResponse> ListJobsPage(const JobManager& jobs,
                                                  const v1::ListJobsRequest& request,
                                                  int64_t max_page_bytes, PageEncoding encoding) {
  ASSIGN_OR_RETURN(int size, PageSize(request.page_size()));
  if (request.view() == v1::JOB_VIEW_FULL) size = std::min(size, kMaxFullViewPageSize);
  ASSIGN_OR_RETURN(const PageCursor start, ParsePageToken("jobs", request.page_token()));
  v1::Job probe;
  RETURN_IF_ERROR(ApplyView(request.view(), probe));
  // Every job's id and order key, then only the page's jobs copied whole: a
  // page of one must not copy every kept job's spec, plan history and
  // checkpoint lists (up to some 640 KiB each).
  const std::vector<JobManager::JobSummary> all = jobs.Summaries();
  std::vector<PageItem> keyed;
  keyed.reserve(all.size());
  for (const JobManager::JobSummary& job : all) keyed.push_back({job.id, job.create_time_nanos});
  std::vector<v1::Job> page;
  v1::ListJobsResponse response;
  response.set_next_page_token(Slice(
      keyed, "jobs", start, size, max_page_bytes, encoding,
      [&](size_t i) -> std::optional<v1::Job> {
        absl::StatusOr<v1::Job> job = jobs.Get(all[i].id);
        if (!job.ok()) return std::nullopt;             // dropped since the summaries
        ApplyView(request.view(), *job).IgnoreError();  // the view was checked above
        return *std::move(job);
      },
      page));
  for (v1::Job& job : page) *response.add_jobs() = std::move(job);
  return response;
}

absl::StatusOr<v1::ListWorkersResponse> ListWorkersPage(const WorkerRegistry& workers,
                                                        const JobManager& jobs,
                                                        const v1::ListWorkersRequest& request,
                                                        int64_t max_page_bytes,
                                                        PageEncoding encoding) {
  ASSIGN_OR_RETURN(const int size, PageSize(request.page_size()));
  ASSIGN_OR_RETURN(const PageCursor start, ParsePageToken("workers", request.page_token()));
  std::vector<v1::Worker> all = workers.List();
  std::vector<PageItem> keyed;
  keyed.reserve(all.size());
  for (const v1::Worker& worker : all) keyed.push_back({worker.id(), WorkerKey(worker)});
  std::vector<v1::Worker> page;
  v1::ListWorkersResponse response;
  response.set_next_page_token(Slice(
      keyed, "workers", start, size, max_page_bytes, encoding,
      [&](size_t i) -> std::optional<v1::Worker> {
        // A copy: `keyed` holds views of the ids in `all`.
        v1::Worker worker = all[i];
        worker.set_drained(jobs.IsDrained(worker));
        return worker;
      },
      page));
  for (v1::Worker& worker : page) *response.add_workers() = std::move(worker);
  return response;
}

absl::StatusOr<v1::Job> GetJobInView(const JobManager& jobs, const v1::GetJobRequest& request) {
  v1::Job probe;
  RETURN_IF_ERROR(ApplyView(request.view(), probe));
  ASSIGN_OR_RETURN(v1::Job job, jobs.Get(request.id()));
  RETURN_IF_ERROR(ApplyView(request.view(), job));
  return job;
}

}  // namespace pipetrain
