#include "cli/link_summary.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/prometheus_text.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<std::map<std::string, KindTotals>> SumLinkMetrics(
    const std::vector<std::string>& pages) {
  std::map<std::string, KindTotals> totals;
  for (const std::string& page : pages) {
    ASSIGN_OR_RETURN(std::vector<MetricSample> samples, ParsePrometheusText(page));
    for (const MetricSample& s : samples) {
      if (s.name == "pipetrain_collective_bytes_total") {
        // Collectives by purpose, as kinds of their own ("collective:data_parallel").
        auto purpose = s.labels.find("purpose");
        auto encoding = s.labels.find("encoding");
        if (purpose == s.labels.end() || encoding == s.labels.end()) continue;
        KindTotals& t = totals["collective:" + purpose->second];
        if (encoding->second == "raw") t.raw_bytes += s.value;
        if (encoding->second == "wire") t.wire_bytes += s.value;
        continue;
      }
      // AccTFM's compressed tensor-parallel all-reduces, a kind of their own.
      if (s.name == "pipetrain_tensor_parallel_compressed_bytes_total") {
        auto encoding = s.labels.find("encoding");
        if (encoding == s.labels.end()) continue;
        KindTotals& t = totals["collective:tensor_parallel_compressed"];
        if (encoding->second == "raw") t.raw_bytes += s.value;
        if (encoding->second == "wire") t.wire_bytes += s.value;
        continue;
      }
      if (s.name == "pipetrain_tensor_parallel_compression_error") {
        KindTotals& t = totals["collective:tensor_parallel_compressed"];
        if (s.value > 0) t.error_sum += s.value, ++t.error_links;
        continue;
      }
      auto kind = s.labels.find("kind");
      if (kind == s.labels.end()) continue;
      KindTotals& t = totals[kind->second];
      if (s.name == "pipetrain_link_bytes_total") {
        auto encoding = s.labels.find("encoding");
        if (encoding == s.labels.end()) continue;
        if (encoding->second == "raw") t.raw_bytes += s.value;
        if (encoding->second == "wire") t.wire_bytes += s.value;
      } else if (s.name == "pipetrain_link_device_bytes_total") {
        t.device_bytes += s.value;
      } else if (s.name == "pipetrain_link_compressed_tensors_total") {
        t.compressed_tensors += s.value;
      } else if (s.name == "pipetrain_link_compression_error") {
        t.error_sum += s.value;
        ++t.error_links;
      }
    }
  }
  // An unfused tied-embedding exchange counts twice in the metrics: as the
  // owners' TIED_EMBEDDING_GRAD sends and as their embedding_sync
  // "collective" (worker_metrics.cc), with the same bytes. Listed once, as
  // the link; what is left under the collective is the fused all-reduce's.
  if (auto link = totals.find("TIED_EMBEDDING_GRAD"); link != totals.end()) {
    if (auto sync = totals.find("collective:embedding_sync"); sync != totals.end()) {
      sync->second.raw_bytes = std::max(0.0, sync->second.raw_bytes - link->second.raw_bytes);
      sync->second.wire_bytes = std::max(0.0, sync->second.wire_bytes - link->second.wire_bytes);
    }
  }
  return totals;
}

std::string FormatLinkSummary(const std::map<std::string, KindTotals>& totals) {
  constexpr double kMiB = 1 << 20;
  size_t width = 20;  // the kinds' column, as wide as the longest name listed
  for (const auto& [kind, t] : totals) {
    if (t.raw_bytes > 0) width = std::max(width, kind.size());
  }
  std::string out;
  for (const auto& [kind, t] : totals) {
    if (t.raw_bytes <= 0) continue;
    absl::StrAppendFormat(&out, "  %-*s %9.2f MiB raw", static_cast<int>(width), kind,
                          t.raw_bytes / kMiB);
    // Collectives have no tensor count; a smaller wire size says compressed.
    const bool compressed =
        t.compressed_tensors > 0 || (t.wire_bytes > 0 && t.wire_bytes < t.raw_bytes);
    if (compressed && t.wire_bytes > 0) {
      absl::StrAppendFormat(&out, " -> %.2f MiB wire (%.1fx)", t.wire_bytes / kMiB,
                            t.raw_bytes / t.wire_bytes);
      if (t.error_links > 0) {
        absl::StrAppendFormat(&out, ", relative error %.3f", t.error_sum / t.error_links);
      }
    } else if (t.wire_bytes > t.raw_bytes) {
      // An exact collective sends more than its tensors' size (a ring
      // all-reduce 2 (n - 1) / n of it): what crossed the links.
      absl::StrAppendFormat(&out, ", %.2f MiB sent", t.wire_bytes / kMiB);
    }
    if (t.device_bytes > 0) {
      absl::StrAppendFormat(&out, "; %.2f MiB device to device (NCCL)", t.device_bytes / kMiB);
    }
    out += "\n";
  }
  return out;
}

absl::StatusOr<std::string> FormatTunedPartitions(const std::vector<std::string>& pages) {
  // (layer, 0 attention / 1 MLP) -> name and the counts seen per pass.
  struct Seen {
    std::string name;
    std::set<int> forward, backward;
  };
  std::map<std::pair<int, int>, Seen> units;
  for (const std::string& page : pages) {
    ASSIGN_OR_RETURN(std::vector<MetricSample> samples, ParsePrometheusText(page));
    for (const MetricSample& s : samples) {
      if (s.name != "pipetrain_tensor_parallel_partitions") continue;
      auto unit = s.labels.find("unit");
      auto pass = s.labels.find("pass");
      if (unit == s.labels.end() || pass == s.labels.end()) continue;
      const bool attention = absl::StartsWith(unit->second, "attn_");
      int layer = 0;
      if (!absl::SimpleAtoi(unit->second.substr(unit->second.find('_') + 1), &layer)) continue;
      Seen& seen = units[{layer, attention ? 0 : 1}];
      seen.name = unit->second;
      (pass->second == "forward" ? seen.forward : seen.backward).insert(static_cast<int>(s.value));
    }
  }
  std::vector<std::string> parts;
  for (const auto& [key, seen] : units) {
    parts.push_back(absl::StrCat(seen.name, " ", absl::StrJoin(seen.forward, "|"), "/",
                                 absl::StrJoin(seen.backward, "|")));
  }
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<std::string> FormatTensorParallelOverlap(const std::vector<std::string>& pages) {
  double all_reduce = 0, waited = 0;
  for (const std::string& page : pages) {
    ASSIGN_OR_RETURN(std::vector<MetricSample> samples, ParsePrometheusText(page));
    for (const MetricSample& s : samples) {
      if (s.name == "pipetrain_collective_seconds_total") {
        auto purpose = s.labels.find("purpose");
        if (purpose != s.labels.end() && purpose->second == "tensor_parallel")
          all_reduce += s.value;
      } else if (s.name == "pipetrain_tensor_parallel_waited_seconds_total") {
        waited += s.value;
      }
    }
  }
  if (all_reduce <= 0) return std::string();
  // Waiting also counts a queued all-reduce's wait for the background
  // thread, so it can exceed the all-reduce time: then nothing is hidden.
  const double hidden = std::max(0.0, 1 - waited / all_reduce);
  return absl::StrFormat("all-reduces %.1f s, waited %.1f s: %.0f %% hidden behind compute",
                         all_reduce, waited, 100 * hidden);
}

}  // namespace pipetrain
