#include "cli/link_summary.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(SumLinkMetrics, TwoWorkers_SummedByKind) {
  const std::string a =
      "pipetrain_link_bytes_total{encoding=\"raw\",kind=\"ACTIVATION\",peer=\"1\"} 2097152\n"
      "pipetrain_link_bytes_total{encoding=\"wire\",kind=\"ACTIVATION\",peer=\"1\"} 131072\n"
      "pipetrain_link_compressed_tensors_total{kind=\"ACTIVATION\",peer=\"1\"} 8\n"
      "pipetrain_link_compression_error{kind=\"ACTIVATION\",peer=\"1\"} 0.1\n"
      "pipetrain_stage_loss 2\n";
  const std::string b =
      "pipetrain_link_bytes_total{encoding=\"raw\",kind=\"ACTIVATION\",peer=\"2\"} 2097152\n"
      "pipetrain_link_bytes_total{encoding=\"wire\",kind=\"ACTIVATION\",peer=\"2\"} 131072\n"
      "pipetrain_link_compressed_tensors_total{kind=\"ACTIVATION\",peer=\"2\"} 8\n"
      "pipetrain_link_compression_error{kind=\"ACTIVATION\",peer=\"2\"} 0.3\n"
      "pipetrain_link_bytes_total{encoding=\"raw\",kind=\"ACTIVATION_GRAD\",peer=\"0\"} 1048576\n"
      "pipetrain_link_bytes_total{encoding=\"wire\",kind=\"ACTIVATION_GRAD\",peer=\"0\"} 1048576\n"
      "pipetrain_link_device_bytes_total{kind=\"ACTIVATION_GRAD\",peer=\"0\"} 524288\n";
  auto totals = SumLinkMetrics({a, b});
  ASSERT_TRUE(totals.ok()) << totals.status();
  const KindTotals& act = totals->at("ACTIVATION");
  EXPECT_EQ(act.raw_bytes, 4194304);
  EXPECT_EQ(act.wire_bytes, 262144);
  EXPECT_EQ(act.compressed_tensors, 16);
  EXPECT_EQ(act.error_links, 2);
  EXPECT_EQ(FormatLinkSummary(*totals),
            "  ACTIVATION                4.00 MiB raw -> 0.25 MiB wire (16.0x), relative error "
            "0.200\n"
            "  ACTIVATION_GRAD           1.00 MiB raw; 0.50 MiB device to device (NCCL)\n");
}

TEST(SumLinkMetrics, Collectives_AKindPerPurpose) {
  const std::string a =
      "pipetrain_collective_bytes_total{encoding=\"raw\",purpose=\"data_parallel\"} 4194304\n"
      "pipetrain_collective_bytes_total{encoding=\"wire\",purpose=\"data_parallel\"} 524288\n"
      "pipetrain_collective_bytes_total{encoding=\"raw\",purpose=\"grad_clip\"} 1048576\n"
      "pipetrain_collective_bytes_total{encoding=\"wire\",purpose=\"grad_clip\"} 1048576\n"
      "pipetrain_collective_bytes_total{encoding=\"raw\",purpose=\"tensor_parallel\"} 1048576\n"
      "pipetrain_collective_bytes_total{encoding=\"wire\",purpose=\"tensor_parallel\"} "
      "1572864\n";
  auto totals = SumLinkMetrics({a, a});
  ASSERT_TRUE(totals.ok()) << totals.status();
  EXPECT_EQ(totals->at("collective:data_parallel").raw_bytes, 8388608);
  EXPECT_EQ(FormatLinkSummary(*totals),
            "  collective:data_parallel        8.00 MiB raw -> 1.00 MiB wire (8.0x)\n"
            "  collective:grad_clip            2.00 MiB raw\n"
            "  collective:tensor_parallel      2.00 MiB raw, 3.00 MiB sent\n");
}

// The owners of an unfused tied embedding count their exchange as
// TIED_EMBEDDING_GRAD sends and as an embedding_sync collective: listed
// once. A fused all-reduce (no such sends) keeps its collective line.
TEST(SumLinkMetrics, UnfusedEmbeddingExchange_ListedOnceAsItsLink) {
  const std::string owner =
      "pipetrain_link_bytes_total{encoding=\"raw\",kind=\"TIED_EMBEDDING_GRAD\",peer=\"3\"} "
      "1048576\n"
      "pipetrain_link_bytes_total{encoding=\"wire\",kind=\"TIED_EMBEDDING_GRAD\",peer=\"3\"} "
      "1048576\n"
      "pipetrain_collective_bytes_total{encoding=\"raw\",purpose=\"embedding_sync\"} 1048576\n"
      "pipetrain_collective_bytes_total{encoding=\"wire\",purpose=\"embedding_sync\"} 1048576\n";
  auto unfused = SumLinkMetrics({owner, owner});
  ASSERT_TRUE(unfused.ok()) << unfused.status();
  EXPECT_EQ(FormatLinkSummary(*unfused), "  TIED_EMBEDDING_GRAD       2.00 MiB raw\n");

  const std::string fused_owner =
      "pipetrain_collective_bytes_total{encoding=\"raw\",purpose=\"embedding_sync\"} 1048576\n"
      "pipetrain_collective_bytes_total{encoding=\"wire\",purpose=\"embedding_sync\"} 1572864\n";
  auto fused = SumLinkMetrics({fused_owner, fused_owner});
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(FormatLinkSummary(*fused),
            "  collective:embedding_sync      2.00 MiB raw, 3.00 MiB sent\n");
}

// AccTFM's compressed tensor-parallel all-reduces: their bytes and the
// error of the workers that compressed (an exact worker's 0 is left out).
TEST(SumLinkMetrics, CompressedTensorParallel_AKindWithItsError) {
  const std::string a =
      "pipetrain_tensor_parallel_compressed_bytes_total{encoding=\"raw\"} 1048576\n"
      "pipetrain_tensor_parallel_compressed_bytes_total{encoding=\"wire\"} 65536\n"
      "pipetrain_tensor_parallel_compression_error 0.5\n";
  const std::string b = "pipetrain_tensor_parallel_compression_error 0\n";
  auto totals = SumLinkMetrics({a, a, b});
  ASSERT_TRUE(totals.ok()) << totals.status();
  EXPECT_EQ(FormatLinkSummary(*totals),
            "  collective:tensor_parallel_compressed      2.00 MiB raw -> 0.12 MiB wire (16.0x), "
            "relative error 0.500\n");
}

TEST(SumLinkMetrics, NotPrometheusText_InvalidArgument) {
  EXPECT_EQ(SumLinkMetrics({"<html>"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FormatTunedPartitions, ModelOrderForwardSlashBackwardDisagreementsListed) {
  const std::string a =
      "pipetrain_tensor_parallel_partitions{pass=\"forward\",unit=\"mlp_0\"} 2\n"
      "pipetrain_tensor_parallel_partitions{pass=\"backward\",unit=\"mlp_0\"} 1\n"
      "pipetrain_tensor_parallel_partitions{pass=\"forward\",unit=\"attn_10\"} 4\n"
      "pipetrain_tensor_parallel_partitions{pass=\"backward\",unit=\"attn_10\"} 4\n"
      "pipetrain_tensor_parallel_partitions{pass=\"forward\",unit=\"attn_0\"} 4\n"
      "pipetrain_tensor_parallel_partitions{pass=\"backward\",unit=\"attn_0\"} 2\n";
  const std::string b =
      "pipetrain_tensor_parallel_partitions{pass=\"forward\",unit=\"mlp_0\"} 4\n"
      "pipetrain_tensor_parallel_partitions{pass=\"backward\",unit=\"mlp_0\"} 1\n";
  EXPECT_EQ(FormatTunedPartitions({a, b}).value(), "attn_0 4/2, mlp_0 2|4/1, attn_10 4/4");
  EXPECT_EQ(FormatTunedPartitions({"pipetrain_iterations_total 3\n"}).value(), "");
}

TEST(FormatTensorParallelOverlap, AllReduceTimeAgainstWaitedSummedOverWorkers) {
  const std::string a =
      "pipetrain_collective_seconds_total{purpose=\"tensor_parallel\"} 6\n"
      "pipetrain_collective_seconds_total{purpose=\"data_parallel\"} 100\n"
      "pipetrain_tensor_parallel_waited_seconds_total 1\n";
  const std::string b =
      "pipetrain_collective_seconds_total{purpose=\"tensor_parallel\"} 4\n"
      "pipetrain_tensor_parallel_waited_seconds_total 2.5\n";
  EXPECT_EQ(FormatTensorParallelOverlap({a, b}).value(),
            "all-reduces 10.0 s, waited 3.5 s: 65 % hidden behind compute");
  // Waiting longer than the all-reduces took (a queued one's wait for the
  // background thread) hides nothing.
  EXPECT_EQ(FormatTensorParallelOverlap({"pipetrain_collective_seconds_total{purpose=\""
                                         "tensor_parallel\"} 1\n"
                                         "pipetrain_tensor_parallel_waited_seconds_total 2\n"})
                .value(),
            "all-reduces 1.0 s, waited 2.0 s: 0 % hidden behind compute");
  EXPECT_EQ(FormatTensorParallelOverlap({"pipetrain_iterations_total 3\n"}).value(), "");
}

}  // namespace
}  // namespace pipetrain
