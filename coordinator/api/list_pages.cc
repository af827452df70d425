#include "coordinator/api/list_pages.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

struct PageStart {
  size_t position = 0;  // items earlier pages returned
  std::string last_id;  // the last of them; empty on the first page
};

absl::StatusOr<int> PageSize(int32_t requested) {
  if (requested < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be in [0, ", kMaxPageSize, "], got ", requested));
  }
  if (requested == 0) return kDefaultPageSize;
  return std::min<int>(requested, kMaxPageSize);
}

std::string MakeToken(absl::string_view list, size_t position, absl::string_view last_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(list, "|", position, "|", last_id));
}

absl::StatusOr<PageStart> ParseToken(absl::string_view list, const std::string& token) {
  if (token.empty()) return PageStart{};
  const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
      "page_token: not a ", list,
      " page token of this coordinator; pass next_page_token unchanged, or none for the first "
      "page"));
  if (token.size() > kMaxPageTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: ", token.size(), " bytes exceeds the limit of ", kMaxPageTokenBytes));
  }
  std::string decoded;
  if (!absl::WebSafeBase64Unescape(token, &decoded)) return bad;
  std::vector<std::string> parts = absl::StrSplit(decoded, absl::MaxSplits('|', 2));
  PageStart start;
  if (parts.size() != 3 || parts[0] != list || !absl::SimpleAtoi(parts[1], &start.position) ||
      start.position > 1000000000 || parts[2].empty()) {
    return bad;
  }
  start.last_id = parts[2];
  return start;
}

// Items [begin, begin + size) of `items` after `start`, and the next token.
template <typename T, typename IdOf>
std::string Slice(std::vector<T>& items, absl::string_view list, const PageStart& start, int size,
                  IdOf id_of, std::vector<T>& page) {
  size_t begin = std::min(start.position, items.size());
  if (!start.last_id.empty()) {
    auto it = std::find_if(items.begin(), items.end(),
                           [&](const T& item) { return id_of(item) == start.last_id; });
    if (it != items.end()) begin = static_cast<size_t>(it - items.begin()) + 1;
  }
  const size_t end = std::min(items.size(), begin + static_cast<size_t>(size));
  for (size_t i = begin; i < end; ++i) page.push_back(std::move(items[i]));
  if (end >= items.size() || page.empty()) return "";
  return MakeToken(list, start.position + page.size(), id_of(page.back()));
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
                                                  const v1::ListJobsRequest& request) {
  ASSIGN_OR_RETURN(const int size, PageSize(request.page_size()));
  ASSIGN_OR_RETURN(const PageStart start, ParseToken("jobs", request.page_token()));
  v1::Job probe;
  RETURN_IF_ERROR(ApplyView(request.view(), probe));
  // List() leaves the loss histories out; the full view reads each job again.
  std::vector<v1::Job> all = jobs.List();
  std::vector<v1::Job> page;
  v1::ListJobsResponse response;
  response.set_next_page_token(Slice(
      all, "jobs", start, size, [](const v1::Job& j) { return j.id(); }, page));
  for (v1::Job& job : page) {
    if (request.view() == v1::JOB_VIEW_FULL) {
      absl::StatusOr<v1::Job> full = jobs.Get(job.id());
      if (full.ok()) job = *std::move(full);  // else it was just dropped: keep the basic view
    }
    *response.add_jobs() = std::move(job);
  }
  return response;
}

absl::StatusOr<v1::ListWorkersResponse> ListWorkersPage(const WorkerRegistry& workers,
                                                        const JobManager& jobs,
                                                        const v1::ListWorkersRequest& request) {
  ASSIGN_OR_RETURN(const int size, PageSize(request.page_size()));
  ASSIGN_OR_RETURN(const PageStart start, ParseToken("workers", request.page_token()));
  std::vector<v1::Worker> all = workers.List();
  std::vector<v1::Worker> page;
  v1::ListWorkersResponse response;
  response.set_next_page_token(Slice(
      all, "workers", start, size, [](const v1::Worker& w) { return w.id(); }, page));
  for (v1::Worker& worker : page) {
    worker.set_drained(jobs.IsDrained(worker));
    *response.add_workers() = std::move(worker);
  }
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
