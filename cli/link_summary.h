// The link summary `pipetrain up` prints after a job: per tensor kind, the
// bytes the workers sent before and after compression and the sampled
// compression error, read from the workers' /metrics pages
// (worker/agent/worker_metrics.h names the metrics).
#ifndef PIPETRAIN_CLI_LINK_SUMMARY_H_
#define PIPETRAIN_CLI_LINK_SUMMARY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain {

struct KindTotals {
  double raw_bytes = 0;
  double wire_bytes = 0;
  double compressed_tensors = 0;
  double device_bytes = 0;  // of wire_bytes: device to device (NCCL)
  double error_sum = 0;     // of the workers' pipetrain_link_compression_error
  int error_links = 0;
};

// Sums over all pages (one per worker) by tensor kind, and the collectives
// (pipetrain_collective_bytes_total) as kinds "collective:<purpose>"; the
// unfused tied-embedding exchange, which the workers count both as
// TIED_EMBEDDING_GRAD sends and as an embedding_sync collective, only
// under TIED_EMBEDDING_GRAD.
// INVALID_ARGUMENT for a page that is not Prometheus text.
absl::StatusOr<std::map<std::string, KindTotals>> SumLinkMetrics(
    const std::vector<std::string>& pages);

// One line per kind with traffic, the kinds in a column as wide as the
// longest (at least 20), e.g.
//   "  ACTIVATION        12.00 MiB raw -> 0.75 MiB wire (16.0x), relative error 0.071"
// ("raw" alone when nothing of that kind was compressed).
std::string FormatLinkSummary(const std::map<std::string, KindTotals>& totals);

// The AccTFM partition counts the workers report
// (pipetrain_tensor_parallel_partitions{unit,pass}, with measured tuning),
// as "attn_0 4/2, mlp_0 2/2" (forward/backward) in model order; units whose
// workers disagree (replicas tune apart) list each value, "2|4". Empty when
// no worker reports any. INVALID_ARGUMENT for a page that does not parse.
absl::StatusOr<std::string> FormatTunedPartitions(const std::vector<std::string>& pages);

// The workers' tensor-parallel all-reduce time against the time their
// stages waited for it (pipetrain_collective_seconds_total{purpose=
// "tensor_parallel"}, pipetrain_tensor_parallel_waited_seconds_total),
// summed: "all-reduces 12.3 s, waited 4.5 s: 63 % hidden behind compute".
// Empty when there is none. INVALID_ARGUMENT for a page that does not
// parse.
absl::StatusOr<std::string> FormatTensorParallelOverlap(const std::vector<std::string>& pages);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_LINK_SUMMARY_H_
