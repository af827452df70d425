#include "coordinator/api/list_pages.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/proto_time.h"
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

// A job's order key: its create_time in nanoseconds (jobs are listed as
// submitted, and restored in that order).
int64_t JobKey(const v1::Job& job) {
  return absl::ToUnixNanos(FromProtoTimestamp(job.create_time()));
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

// The items of `items` on the page after `cursor`, and the next token: at
// most `size` of them, and no more than `max_bytes` in `encoding` once each
// is `prepare`d (the first one whatever its size).
template <typename T, typename IdOf, typename KeyOf, typename Prepare>
std::string Slice(std::vector<T>& items, absl::string_view list, const PageCursor& cursor, int size,
                  int64_t max_bytes, PageEncoding encoding, IdOf id_of, KeyOf key_of,
                  Prepare prepare, std::vector<T>& page) {
  std::vector<PageItem> keyed;
  keyed.reserve(items.size());
  for (const T& item : items) keyed.push_back({id_of(item), key_of(item)});
  const size_t begin = PageBegin(keyed, cursor);
  const size_t end = std::min(items.size(), begin + static_cast<size_t>(size));
  int64_t bytes = 0;
  size_t next = begin;
  for (; next < end; ++next) {
    prepare(items[next]);
    const int64_t item_bytes = EncodedBytes(items[next], encoding);
    if (!page.empty() && bytes + item_bytes > max_bytes) break;
    bytes += item_bytes;
    page.push_back(std::move(items[next]));
  }
  if (next >= items.size() || page.empty()) return "";
  return MakePageToken(
      list, PageCursor{cursor.position + page.size(), id_of(page.back()), key_of(page.back())});
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
  v1::ListJobsResponse response;
  int64_t bytes = 0;
  size_t next = PageBegin(keyed, start);
  for (; next < all.size() && response.jobs_size() < size; ++next) {
    absl::StatusOr<v1::Job> job = jobs.Get(all[next].id);
    if (!job.ok()) continue;  // dropped since the summaries: nothing to list
    RETURN_IF_ERROR(ApplyView(request.view(), *job));
    const int64_t item_bytes = EncodedBytes(*job, encoding);
    if (response.jobs_size() > 0 && bytes + item_bytes > max_page_bytes) break;
    bytes += item_bytes;
    *response.add_jobs() = *std::move(job);
  }
  if (next < all.size() && response.jobs_size() > 0) {
    const v1::Job& last = response.jobs(response.jobs_size() - 1);
    response.set_next_page_token(
        MakePageToken("jobs", PageCursor{start.position + static_cast<size_t>(response.jobs_size()),
                                         last.id(), JobKey(last)}));
  }
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
  std::vector<v1::Worker> page;
  v1::ListWorkersResponse response;
  response.set_next_page_token(Slice(
      all, "workers", start, size, max_page_bytes, encoding,
      [](const v1::Worker& w) -> const std::string& { return w.id(); }, WorkerKey,
      [&](v1::Worker& worker) { worker.set_drained(jobs.IsDrained(worker)); }, page));
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
