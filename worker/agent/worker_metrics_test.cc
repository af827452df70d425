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

}  // namespace
}  // namespace pipetrain
