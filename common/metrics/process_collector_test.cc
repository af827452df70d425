#include "common/metrics/process_collector.h"

#include <ctime>

#include "common/metrics/collectable_list.h"
#include "common/metrics/metrics_testing.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace pipetrain {
namespace {

using testing::SeriesValue;

TEST(ParseProcStat, CommandWithSpacesAndParens_FieldsAfterTheLastParen) {
  // proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
  const std::string stat =
      "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3 0 1000 8192000 300 rest 1 2\n";
  const std::optional<ProcStat> parsed = ParseProcStat(stat, /*ticks=*/100, /*page=*/4096);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_DOUBLE_EQ(parsed->cpu_seconds, 3.0);
  EXPECT_DOUBLE_EQ(parsed->start_seconds_after_boot, 10.0);
  EXPECT_DOUBLE_EQ(parsed->virtual_bytes, 8192000.0);
  EXPECT_DOUBLE_EQ(parsed->resident_bytes, 300.0 * 4096);
}

TEST(ParseProcStat, Truncated_Nullopt) {
  EXPECT_FALSE(ParseProcStat("4242 (x) S 1 2 3", 100, 4096).has_value());
  EXPECT_FALSE(ParseProcStat("no parenthesis", 100, 4096).has_value());
}

TEST(ParseBootTime, ProcStatText_Btime) {
  EXPECT_EQ(ParseBootTime("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"), 1700000000.0);
  EXPECT_FALSE(ParseBootTime("cpu 1 2 3\n").has_value());
}

TEST(ProcessCollector, Collect_ThisProcess_PlausibleValues) {
  ProcessCollector process;
  const double now = static_cast<double>(std::time(nullptr));
  ASSERT_TRUE(SeriesValue(process, "process_cpu_seconds_total").has_value());
  EXPECT_GE(*SeriesValue(process, "process_cpu_seconds_total"), 0.0);
  EXPECT_GT(SeriesValue(process, "process_resident_memory_bytes").value_or(0), 1e5);
  EXPECT_GE(SeriesValue(process, "process_virtual_memory_bytes").value_or(0),
            SeriesValue(process, "process_resident_memory_bytes").value_or(0));
  EXPECT_GE(SeriesValue(process, "process_open_fds").value_or(0), 3.0);  // stdin, stdout, stderr
  EXPECT_GT(SeriesValue(process, "process_max_fds").value_or(0), 3.0);
  const double start = SeriesValue(process, "process_start_time_seconds").value_or(0);
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600) << "this test process started over an hour ago?";
}

TEST(CollectableList, Collect_RegistryAndCollector_FamiliesOfBoth) {
  prometheus::Registry registry;
  prometheus::BuildCounter().Name("pipetrain_test_total").Help("h").Register(registry).Add({});
  ProcessCollector process;
  CollectableList all({&registry, &process});
  EXPECT_EQ(SeriesValue(all, "pipetrain_test_total"), 0.0);
  EXPECT_TRUE(SeriesValue(all, "process_open_fds").has_value());
}

}  // namespace
}  // namespace pipetrain
