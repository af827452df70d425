// Compression on a real pipeline (the Compression issue's acceptance): a
// coordinator and four worker processes run jobs whose spec.compression asks
// for codecs, and the workers' own /metrics show what crossed the links.
//  - Forward token_topk:keep=0.5+piecewise:bits=3 (half the tokens, 4 bits
//    per value) sends at least 15x fewer activation bytes than fp32.
//  - Backward powersgd:rank=4 with error feedback and epilogue-only
//    compresses exactly the cool-down's gradient sends (P - s per step on
//    stage s) and leaves the rest, and the tied gradient, raw.
// Metrics are cumulative per worker process, so each job's figures are the
// difference of scrapes before and after it.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cli/coordinator_client.h"
#include "cli/link_summary.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

constexpr int kWorkers = 4;
constexpr int kSteps = 3;
constexpr int kMicroBatches = 4;

v1::JobSpec Spec(const std::string& forward, const std::string& backward, bool feedback,
                 bool epilogue_only) {
  v1::JobSpec spec;
  spec.mutable_model()->set_n_layer(2);  // 6 units: 4 stages of 1-2 units
  spec.mutable_model()->set_n_head(4);
  // Activations of [2, 64, 128]: large enough that the codecs' headers
  // (~100 bytes) do not hide the 16x of the body.
  spec.mutable_model()->set_d_model(128);
  spec.mutable_training()->set_seq_len(64);
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_training()->set_micro_batches(kMicroBatches);
  spec.mutable_training()->set_steps(kSteps);
  spec.mutable_data()->set_synthetic_bytes(20000);
  spec.mutable_parallelism()->set_stages(kWorkers);
  v1::CompressionSpec* c = spec.mutable_compression();
  c->set_forward(forward);
  c->set_backward(backward);
  c->set_error_feedback(feedback);
  c->set_epilogue_only(epilogue_only);
  return spec;
}

class CompressionClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = testing::StartTestCluster("compression", kWorkers);
    ASSERT_NE(cluster_, nullptr);
    stub_ = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  }

  // Per worker (stage order is not worker order: sum over all of them).
  std::map<std::string, KindTotals> Scrape() {
    std::vector<std::string> pages;
    for (int i = 0; i < kWorkers; ++i) {
      pages.push_back(testing::ScrapeMetrics(testing::WorkerMetricsPort("compression", i)));
    }
    auto totals = SumLinkMetrics(pages);
    EXPECT_TRUE(totals.ok()) << totals.status();
    return totals.ok() ? *totals : std::map<std::string, KindTotals>{};
  }

  // Runs `spec` to the end and returns what its links carried.
  std::map<std::string, KindTotals> RunJob(const v1::JobSpec& spec, v1::Job* job) {
    std::map<std::string, KindTotals> before = Scrape();
    const std::string id = testing::SubmitJob(*stub_, spec);
    *job = testing::AwaitJob(*stub_, id, absl::Seconds(120), testing::Ended);
    std::map<std::string, KindTotals> after = Scrape();
    for (auto& [kind, t] : after) {
      const KindTotals& b = before[kind];
      t.raw_bytes -= b.raw_bytes;
      t.wire_bytes -= b.wire_bytes;
      t.compressed_tensors -= b.compressed_tensors;
    }
    return after;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

TEST_F(CompressionClusterTest, TokenTopKPlusPiecewise_AtLeast15xFewerActivationBytes) {
  v1::Job job;
  auto links = RunJob(Spec("token_topk:keep=0.5+piecewise:bits=3", "none", false, false), &job);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_TRUE(links.count("ACTIVATION") == 1 && links.count("ACTIVATION_GRAD") == 1);
  const KindTotals& act = links.at("ACTIVATION");
  // 3 boundaries x 4 micro-batches x 3 steps, each [2, 64, 128] fp32.
  EXPECT_EQ(act.compressed_tensors, 3 * kMicroBatches * kSteps);
  EXPECT_EQ(act.raw_bytes, 3.0 * kMicroBatches * kSteps * 2 * 64 * 128 * 4);
  ASSERT_GT(act.wire_bytes, 0);
  const double ratio = act.raw_bytes / act.wire_bytes;
  std::printf("ACTIVATION: %.0f raw bytes, %.0f wire bytes: %.2fx\n", act.raw_bytes,
              act.wire_bytes, ratio);
  EXPECT_GE(ratio, 15.0);
  EXPECT_GT(act.error_links, 0) << "no sampled compression error exported";
  // Gradients were not asked to be compressed: as many sends, as large.
  const KindTotals& grad = links.at("ACTIVATION_GRAD");
  EXPECT_EQ(grad.compressed_tensors, 0);
  EXPECT_EQ(grad.raw_bytes, 3.0 * kMicroBatches * kSteps * 2 * 64 * 128 * 4);
  EXPECT_EQ(grad.raw_bytes, grad.wire_bytes);
  EXPECT_TRUE(std::isfinite(job.progress().loss()));
}

TEST_F(CompressionClusterTest, PowerSgdEpilogueOnly_CompressesExactlyTheCoolDownSends) {
  v1::Job job;
  auto links = RunJob(Spec("none", "powersgd:rank=4", true, true), &job);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_TRUE(links.count("ACTIVATION_GRAD") == 1 && links.count("ACTIVATION") == 1 &&
              links.count("TIED_EMBEDDING_GRAD") == 1);
  const KindTotals& grad = links.at("ACTIVATION_GRAD");
  // 1F1B on 4 stages: stage s compresses its last P - s gradient sends,
  // 3 + 2 + 1 per step, of 3 x 4 gradient sends per step.
  EXPECT_EQ(grad.compressed_tensors, (3 + 2 + 1) * kSteps);
  EXPECT_EQ(grad.raw_bytes, 3.0 * kMicroBatches * kSteps * 2 * 64 * 128 * 4);
  EXPECT_LT(grad.wire_bytes, grad.raw_bytes);
  const KindTotals& act = links.at("ACTIVATION");
  EXPECT_EQ(act.compressed_tensors, 0);
  EXPECT_EQ(act.raw_bytes, 3.0 * kMicroBatches * kSteps * 2 * 64 * 128 * 4);
  const KindTotals& tied = links.at("TIED_EMBEDDING_GRAD");
  EXPECT_EQ(tied.compressed_tensors, 0);
  EXPECT_GT(tied.raw_bytes, 0);
  EXPECT_EQ(tied.raw_bytes, tied.wire_bytes);
  EXPECT_TRUE(std::isfinite(job.progress().loss()));
}

}  // namespace
}  // namespace pipetrain
