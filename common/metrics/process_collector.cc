#include "common/metrics/process_collector.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::optional<double> CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double count = 0;
  while (const dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") ++count;
  }
  closedir(dir);
  return count - 1;  // the descriptor opendir holds
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family{name, help, type, {prometheus::ClientMetric{}}};
  if (type == prometheus::MetricType::Counter) {
    family.metric[0].counter.value = value;
  } else {
    family.metric[0].gauge.value = value;
  }
  return family;
}

}  // namespace

std::optional<ProcStat> ParseProcStat(absl::string_view text, long clock_ticks_per_second,
                                      long page_bytes) {
  // "pid (comm) state ppid ...": fields from the state on (field 3) follow
  // the last ')'.
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos || clock_ticks_per_second <= 0) return std::nullopt;
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(text.substr(close + 1)), ' ', absl::SkipEmpty());
  // Field n of proc(5) is fields[n - 3]: utime 14, stime 15, starttime 22,
  // vsize 23, rss 24 (pages).
  if (fields.size() < 22) return std::nullopt;
  double utime, stime, start, vsize, rss;
  if (!absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime) ||
      !absl::SimpleAtod(fields[19], &start) || !absl::SimpleAtod(fields[20], &vsize) ||
      !absl::SimpleAtod(fields[21], &rss)) {
    return std::nullopt;
  }
  const double ticks = static_cast<double>(clock_ticks_per_second);
  return ProcStat{(utime + stime) / ticks, start / ticks, vsize,
                  rss * static_cast<double>(page_bytes)};
}

std::optional<double> ParseBootTime(absl::string_view proc_stat_text) {
  for (absl::string_view line : absl::StrSplit(proc_stat_text, '\n')) {
    double btime;
    if (absl::ConsumePrefix(&line, "btime ") &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(line), &btime)) {
      return btime;
    }
  }
  return std::nullopt;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  const std::optional<std::string> stat_text = ReadFile("/proc/self/stat");
  const std::optional<ProcStat> stat =
      stat_text ? ParseProcStat(*stat_text, sysconf(_SC_CLK_TCK), sysconf(_SC_PAGESIZE))
                : std::nullopt;
  if (stat.has_value()) {
    families.push_back(Family("process_cpu_seconds_total",
                              "Total user and system CPU time spent in seconds.",
                              MetricType::Counter, stat->cpu_seconds));
    families.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                              MetricType::Gauge, stat->resident_bytes));
    families.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                              MetricType::Gauge, stat->virtual_bytes));
    const std::optional<std::string> proc_stat = ReadFile("/proc/stat");
    const std::optional<double> boot = proc_stat ? ParseBootTime(*proc_stat) : std::nullopt;
    if (boot.has_value()) {
      families.push_back(Family("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.",
                                MetricType::Gauge, *boot + stat->start_seconds_after_boot));
    }
  }
  if (const std::optional<double> fds = CountOpenFds()) {
    families.push_back(
        Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, *fds));
  }
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    families.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                              MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return families;
}

}  // namespace pipetrain
