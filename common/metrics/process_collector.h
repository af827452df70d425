// The standard Prometheus process metrics of this process, read from /proc
// on each scrape (the names client_golang and the other official clients
// export, so existing dashboards and alerts work unchanged):
//
//   process_cpu_seconds_total         counter  user + system CPU time
//   process_resident_memory_bytes     gauge    resident set size
//   process_virtual_memory_bytes      gauge    virtual memory size
//   process_open_fds                  gauge    open file descriptors
//   process_max_fds                   gauge    the soft RLIMIT_NOFILE
//   process_start_time_seconds        gauge    start time, Unix seconds
//
// Linux only. A value that cannot be read is left out of that scrape rather
// than reported as 0. Thread-safe: Collect keeps no state.
#ifndef PIPETRAIN_COMMON_METRICS_PROCESS_COLLECTOR_H_
#define PIPETRAIN_COMMON_METRICS_PROCESS_COLLECTOR_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace pipetrain {

// What /proc/<pid>/stat says, in base units.
struct ProcStat {
  double cpu_seconds = 0;  // utime + stime
  double start_seconds_after_boot = 0;
  double virtual_bytes = 0;
  double resident_bytes = 0;
};

// Parses the text of /proc/<pid>/stat (the command name in parentheses may
// hold spaces and parentheses itself). nullopt when it is malformed.
std::optional<ProcStat> ParseProcStat(absl::string_view text, long clock_ticks_per_second,
                                      long page_bytes);

// The "btime" (boot time, Unix seconds) of the text of /proc/stat.
std::optional<double> ParseBootTime(absl::string_view proc_stat_text);

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_PROCESS_COLLECTOR_H_
