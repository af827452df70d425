#include "worker/agent/worker_metrics.h"

#include "common/metrics/metrics_testing.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// The gauges of "the last iteration" follow it: a later iteration without
// a loss (another job, where this stage does not compute it) or without
// tensor-parallel all-reduces reads 0, not an earlier job's value.
TEST(WorkerMetricsTest, LastIterationGauges_ResetByAnIterationWithoutThem) {
  WorkerMetrics metrics;
  IterationResult with;
  with.micro_batch_losses = {2.0f, 4.0f};
  IterationResult::CollectiveStats tp;
  tp.count = 1;
  tp.compressed_norm_squared = 4;
  tp.compression_error_squared = 1;
  with.collectives["tensor_parallel"] = tp;
  metrics.Observe(with);
  EXPECT_EQ(testing::SeriesValue(*metrics.registry(), "pipetrain_stage_loss"), 3.0);
  EXPECT_EQ(
      testing::SeriesValue(*metrics.registry(), "pipetrain_tensor_parallel_compression_error"),
      0.5);
  metrics.Observe(IterationResult());
  EXPECT_EQ(testing::SeriesValue(*metrics.registry(), "pipetrain_stage_loss"), 0.0);
  EXPECT_EQ(
      testing::SeriesValue(*metrics.registry(), "pipetrain_tensor_parallel_compression_error"),
      0.0);
}

// A link's sampled compression error and a unit's partition count are
// gauges of the run's peers and units: they stay while the run goes on
// (an iteration without error samples keeps the last one) and go when an
// iteration of another job or plan version comes.
TEST(WorkerMetricsTest, RunKeyedGauges_DroppedWhenAnotherRunStarts) {
  WorkerMetrics metrics;
  const auto link_error = [&] {
    return testing::SeriesValue(*metrics.registry(), "pipetrain_link_compression_error",
                                {{"peer", "1"}, {"kind", "activation"}});
  };
  const auto partitions = [&] {
    return testing::SeriesValue(*metrics.registry(), "pipetrain_tensor_parallel_partitions",
                                {{"unit", "attn_0"}, {"pass", "forward"}});
  };
  IterationResult sampled;
  sampled.run = "job-1/1";
  LinkStats link;
  link.compressed_tensors = 2;
  link.error_samples = 2;
  link.error_sum = 0.5;
  sampled.sent[{1, "activation"}] = link;
  sampled.tensor_partitions["attn_0"] = {2, 4};
  metrics.Observe(sampled);
  EXPECT_EQ(link_error(), 0.25);
  EXPECT_EQ(partitions(), 2.0);

  IterationResult unsampled;
  unsampled.run = "job-1/1";
  metrics.Observe(unsampled);
  EXPECT_EQ(link_error(), 0.25);
  EXPECT_EQ(partitions(), 2.0);

  IterationResult next_plan;
  next_plan.run = "job-1/2";
  metrics.Observe(next_plan);
  EXPECT_EQ(link_error(), std::nullopt);
  EXPECT_EQ(partitions(), std::nullopt);

  // A later run's own series appear again.
  sampled.run = "job-2/1";
  metrics.Observe(sampled);
  EXPECT_EQ(link_error(), 0.25);
  EXPECT_EQ(partitions(), 2.0);
}

// A failed call to the coordinator is counted by call and gRPC code name.
TEST(WorkerMetricsTest, CoordinatorCallFailed_CountedByCallAndCodeName) {
  WorkerMetrics metrics;
  metrics.CoordinatorCallFailed(WorkerMetrics::CoordinatorCall::kAssignmentStream,
                                grpc::StatusCode::DEADLINE_EXCEEDED);
  metrics.CoordinatorCallFailed(WorkerMetrics::CoordinatorCall::kAssignmentStream,
                                grpc::StatusCode::DEADLINE_EXCEEDED);
  metrics.CoordinatorCallFailed(WorkerMetrics::CoordinatorCall::kReport,
                                grpc::StatusCode::UNAVAILABLE);
  const std::string name = "pipetrain_worker_coordinator_call_failures_total";
  EXPECT_EQ(testing::SeriesValue(*metrics.registry(), name,
                                 {{"call", "assignment_stream"}, {"code", "DEADLINE_EXCEEDED"}}),
            2.0);
  EXPECT_EQ(testing::SeriesValue(*metrics.registry(), name,
                                 {{"call", "report"}, {"code", "UNAVAILABLE"}}),
            1.0);
  EXPECT_EQ(testing::SeriesValue(*metrics.registry(), name,
                                 {{"call", "heartbeat"}, {"code", "UNAVAILABLE"}}),
            std::nullopt);
}

}  // namespace
}  // namespace pipetrain
