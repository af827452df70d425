// ListJobsPage over a real job manager: pages stay whole while ended jobs
// are pruned between them.
#include "coordinator/api/list_pages.h"

#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/registry/worker_registry.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<std::string> Ids(const v1::ListJobsResponse& page) {
  std::vector<std::string> ids;
  for (const v1::Job& job : page.jobs()) ids.push_back(job.id());
  return ids;
}

// Six jobs, pages of two: after the first page, the first four end and
// the two oldest are pruned (at most two ended jobs are kept), the last of
// the page among them. The next page starts at the oldest job still
// listed after it, job-3; counting two in would skip job-3 and job-4.
TEST(ListJobsPageTest, LastJobOfThePagePruned_NextPageSkipsNothing) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.max_ended_jobs = 2});
  for (int i = 0; i < 6; ++i) {
    const absl::StatusOr<v1::Job> job = jobs.Submit(SmallJobSpec(1));
    ASSERT_TRUE(job.ok()) << job.status();
    clock.Advance(absl::Seconds(1));
  }
  v1::ListJobsRequest request;
  request.set_page_size(2);
  const absl::StatusOr<v1::ListJobsResponse> first = ListJobsPage(jobs, request);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Ids(*first), (std::vector<std::string>{"job-1", "job-2"}));
  for (const char* id : {"job-1", "job-2", "job-3", "job-4"}) ASSERT_TRUE(jobs.Cancel(id).ok());
  jobs.ScheduleQueued();  // prunes
  ASSERT_EQ(jobs.List().size(), 4u);
  ASSERT_EQ(jobs.List().front().id(), "job-3");
  request.set_page_token(first->next_page_token());
  const absl::StatusOr<v1::ListJobsResponse> second = ListJobsPage(jobs, request);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Ids(*second), (std::vector<std::string>{"job-3", "job-4"}));
}

// Each job in the full view may carry 10000 losses: a page of 1000 made a
// response of about 110 MB. The full view's pages hold 20 at most, and go
// on with a token; the basic view's are as asked.
TEST(ListJobsPageTest, FullView_AtMostTwentyAPage) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{});
  for (int i = 0; i < kMaxFullViewPageSize + 5; ++i) {
    ASSERT_TRUE(jobs.Submit(SmallJobSpec(1)).ok());
    clock.Advance(absl::Seconds(1));
  }
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  request.set_view(v1::JOB_VIEW_FULL);
  const v1::ListJobsResponse full = ListJobsPage(jobs, request).value();
  EXPECT_EQ(full.jobs_size(), kMaxFullViewPageSize);
  EXPECT_FALSE(full.next_page_token().empty());
  request.set_page_token(full.next_page_token());
  EXPECT_EQ(ListJobsPage(jobs, request).value().jobs_size(), 5);
  request.clear_page_token();
  request.set_view(v1::JOB_VIEW_BASIC);
  EXPECT_EQ(ListJobsPage(jobs, request).value().jobs_size(), kMaxFullViewPageSize + 5);
}

// A page also ends at a byte budget (kMaxPageBytes: a job may carry 512
// KiB of checkpoint lists), before the job that would pass it but never
// empty, and the next page goes on from there, whole: every job once, in
// order.
TEST(ListJobsPageTest, PageEndsAtTheByteBudget_NextPagesListTheRest) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{});
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(jobs.Submit(SmallJobSpec(1)).ok());
    clock.Advance(absl::Seconds(1));
  }
  const int64_t each = static_cast<int64_t>(jobs.List().front().ByteSizeLong());
  for (const v1::JobView view : {v1::JOB_VIEW_BASIC, v1::JOB_VIEW_FULL}) {
    SCOPED_TRACE(view);
    v1::ListJobsRequest request;
    request.set_view(view);
    std::vector<std::string> listed;
    std::vector<int> sizes;
    do {
      // Room for two and a half jobs: pages of two.
      const v1::ListJobsResponse page = ListJobsPage(jobs, request, each * 5 / 2).value();
      sizes.push_back(page.jobs_size());
      for (const std::string& id : Ids(page)) listed.push_back(id);
      request.set_page_token(page.next_page_token());
    } while (!request.page_token().empty() && sizes.size() < 10);
    EXPECT_EQ(sizes, (std::vector<int>{2, 2, 2, 1}));
    EXPECT_EQ(listed, (std::vector<std::string>{"job-1", "job-2", "job-3", "job-4", "job-5",
                                                "job-6", "job-7"}));
    // A budget smaller than one job still lists one a page.
    request.clear_page_token();
    const v1::ListJobsResponse one = ListJobsPage(jobs, request, 1).value();
    EXPECT_EQ(Ids(one), (std::vector<std::string>{"job-1"}));
    EXPECT_FALSE(one.next_page_token().empty());
  }
}

// REST counts the budget in JSON, which takes more bytes than protobuf for
// the same job: a budget of two and a half jobs' JSON gives pages of two,
// and their JSON stays within it; in protobuf the same budget holds more.
TEST(ListJobsPageTest, JsonEncoding_BudgetCountsTheJson) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{});
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(jobs.Submit(SmallJobSpec(1)).ok());
    clock.Advance(absl::Seconds(1));
  }
  const v1::Job first = jobs.List().front();
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(first, &json).ok());
  ASSERT_GT(json.size(), first.ByteSizeLong());
  const int64_t budget = static_cast<int64_t>(json.size() + 1) * 5 / 2;
  const v1::ListJobsResponse page =
      ListJobsPage(jobs, v1::ListJobsRequest(), budget, PageEncoding::kJson).value();
  EXPECT_EQ(page.jobs_size(), 2);
  int64_t page_json = 0;
  for (const v1::Job& job : page.jobs()) {
    std::string one;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(job, &one).ok());
    page_json += static_cast<int64_t>(one.size()) + 1;
  }
  EXPECT_LE(page_json, budget);
  EXPECT_GT(ListJobsPage(jobs, v1::ListJobsRequest(), budget).value().jobs_size(), 2);
}

}  // namespace
}  // namespace pipetrain
