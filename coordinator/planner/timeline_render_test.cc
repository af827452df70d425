// Also writes the documentation example (a 4-worker 1F1B timeline):
//   bazel run //coordinator/planner:timeline_render_test -- --gtest_filter='*Example*'
// writes docs/images/timeline-example.{svg,json} into the workspace (under
// `bazel test` they go to TEST_TMPDIR), then
//   scripts/screenshot.sh docs/images/timeline-example.svg docs/images/timeline-example.png
#include "coordinator/planner/timeline_render.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// Two stages of two units, fwd 1 s and bwd 2 s per unit, 1 s per transfer.
SimulationResult TwoStageOneFOneB() {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value();
  SimulationCosts costs;
  costs.units.assign(4, UnitSimulationCost{1, 2, 100, 1000});
  costs.tied_grad_bytes = 100;
  costs.optimizer_seconds_per_byte = 1e-4;
  costs.worker_speeds = {1, 1};
  costs.link.bandwidth_bytes_per_second = 100;
  return SimulateIteration(programs, costs).value();
}

// GPT-2 small (12 blocks: 26 units), 8 micro-batches on 4 workers, 1F1B,
// with costs of the order of a CPU node on a 10 Gbit/s network.
SimulationResult FourWorkerExample() {
  const int units = 26;
  std::vector<Range> ranges = UniformPartition(units, 4).value();
  auto programs = CompilePrograms(ranges, units, 8, Schedule::kOneFOneB).value();
  SimulationCosts costs;
  const double activation = 4 * 512 * 768 * 4.0;           // micro-batch 4 x 512 tokens, fp32
  costs.units.push_back({1e-3, 2e-3, activation, 157e6});  // embed (wte + wpe)
  for (int block = 0; block < 12; ++block) {
    costs.units.push_back({6e-3, 12e-3, activation, 9.4e6});   // attn
    costs.units.push_back({8e-3, 16e-3, activation, 18.9e6});  // mlp
  }
  costs.units.push_back({20e-3, 40e-3, 0, 6e3});  // head (LN; tied LM head)
  costs.tied_grad_bytes = 154e6;
  costs.optimizer_seconds_per_byte = 2e-11;
  costs.worker_speeds = {1, 1, 1, 1};
  costs.link = {1.25e9, 50e-6};
  return SimulateIteration(programs, costs).value();
}

// A tiny well-formedness checker: tags nest and close, entities are known.
// Returns "" when fine, else what is wrong and where.
std::string CheckBalancedXml(const std::string& doc) {
  std::vector<std::string> open;
  for (size_t i = 0; i < doc.size(); ++i) {
    if (doc[i] == '&') {
      static const char* const kEntities[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
      bool known = false;
      for (const char* entity : kEntities) known |= doc.compare(i, strlen(entity), entity) == 0;
      if (!known) return absl::StrCat("unknown entity at ", i);
      continue;
    }
    if (doc[i] == '>') return absl::StrCat("stray '>' at ", i);
    if (doc[i] != '<') continue;
    size_t end = i + 1;
    for (char quote = 0; end < doc.size() && (quote || doc[end] != '>'); ++end) {
      if (doc[end] == '"') quote = quote ? 0 : '"';
      if (doc[end] == '<' && !quote) return absl::StrCat("'<' inside a tag at ", end);
    }
    if (end == doc.size()) return absl::StrCat("unterminated tag at ", i);
    const std::string tag = doc.substr(i + 1, end - i - 1);
    const std::string name = tag.substr(0, tag.find_first_of(" \n/", tag[0] == '/' ? 1 : 0));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name.substr(1)) {
        return absl::StrCat("<", name, "> closes <", open.empty() ? "nothing" : open.back(), ">");
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
    i = end;
  }
  return open.empty() ? "" : absl::StrCat("<", open.back(), "> not closed");
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(TimelineRenderTest, CheckBalancedXml_DetectsBrokenDocuments) {
  EXPECT_EQ(CheckBalancedXml("<svg a=\"x>y\"><g><rect/></g><text>a &amp; b</text></svg>"), "");
  EXPECT_THAT(CheckBalancedXml("<svg><g></svg>"), HasSubstr("</svg> closes <g>"));
  EXPECT_THAT(CheckBalancedXml("<svg><text>a & b</text></svg>"), HasSubstr("unknown entity"));
  EXPECT_THAT(CheckBalancedXml("<svg>"), HasSubstr("<svg> not closed"));
}

TEST(TimelineRenderTest, ChromeTraceJson_TwoStages_ParsesWithExpectedFields) {
  const SimulationResult result = TwoStageOneFOneB();
  const auto trace = nlohmann::json::parse(ChromeTraceJson(result, {"alpha", "beta"}));
  ASSERT_TRUE(trace.at("traceEvents").is_array());
  std::vector<nlohmann::json> complete;
  std::map<int, std::string> process_names;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") complete.push_back(e);
    if (e.at("ph") == "M" && e.at("name") == "process_name") {
      process_names[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
    }
  }
  EXPECT_EQ(process_names, (std::map<int, std::string>{{0, "alpha"}, {1, "beta"}}));
  ASSERT_EQ(complete.size(), result.events.size());
  const auto& first = complete[0];  // worker 0's first forward
  EXPECT_EQ(first.at("name"), "F mb0 [0,2)");
  EXPECT_EQ(first.at("cat"), "forward");
  EXPECT_EQ(first.at("pid"), 0);
  EXPECT_EQ(first.at("tid"), 0);
  EXPECT_EQ(first.at("ts"), 0);
  EXPECT_EQ(first.at("dur"), 2e6);
  EXPECT_EQ(first.at("args").at("units"), "[0,2)");
  EXPECT_EQ(first.at("args").at("micro_batch"), 0);
  const auto& send = complete[1];  // its activation, on thread 1 + peer
  EXPECT_EQ(send.at("cat"), "send");
  EXPECT_EQ(send.at("tid"), 2);
  EXPECT_EQ(send.at("ts"), 2e6);
  EXPECT_EQ(send.at("dur"), 1e6);
  EXPECT_EQ(send.at("args").at("tensor"), "ACTIVATION");
  EXPECT_EQ(send.at("args").at("bytes"), 100);
  EXPECT_EQ(trace.at("otherData").at("iteration_seconds"), result.iteration_seconds);
}

TEST(TimelineRenderTest, ChromeTraceJson_FourWorkers_EventsPerThreadDoNotOverlap) {
  const SimulationResult result = FourWorkerExample();
  const auto trace = nlohmann::json::parse(ChromeTraceJson(result, {}));
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> lanes;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    lanes[{e.at("pid").get<int>(), e.at("tid").get<int>()}].push_back(
        {e.at("ts").get<double>(), e.at("dur").get<double>()});
  }
  // Compute per worker; links 0-1, 1-2, 2-3 both ways, and 0-3 both ways (tied gradient).
  EXPECT_EQ(lanes.size(), 4u + 8u);
  for (auto& [lane, spans] : lanes) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      // 1e-6 µs: ts and dur are rounded separately from the same seconds.
      EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first + 1e-6)
          << "pid " << lane.first << " tid " << lane.second << " event " << i;
    }
  }
}

TEST(TimelineRenderTest, ChromeTraceJson_InvalidUtf8Name_StillValidJson) {
  const std::string json = ChromeTraceJson(TwoStageOneFOneB(), {"bad\xff", "ok"});
  EXPECT_TRUE(nlohmann::json::accept(json));
}

TEST(TimelineRenderTest, TimelineSvg_TwoStages_WellFormedWithLanesAndLabels) {
  const SimulationResult result = TwoStageOneFOneB();
  const std::string svg = TimelineSvg(result, {"alpha <a&b>", ""});
  EXPECT_EQ(CheckBalancedXml(svg), "");
  EXPECT_TRUE(absl::StartsWith(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(Count(svg, ">busy "), 2);  // one lane per worker
  EXPECT_EQ(Count(svg, ">alpha &lt;a&amp;b&gt;</text>"), 1);
  EXPECT_EQ(Count(svg, ">worker 1</text>"), 1);
  for (const char* label : {">F0<", ">F2<", ">B0<", ">B2<", ">forward<", ">backward<",
                            ">optimizer<", ">send activation<", ">send gradient<"}) {
    EXPECT_EQ(Count(svg, label), 1 + (label[1] == 'F' || label[1] == 'B')) << label;
  }
  // 1F1B, two stages, 1 s transfers, 0.2 s optimizer: 29.2 s, busy 18.2 s each.
  EXPECT_EQ(result.iteration_seconds, 29.2);
  EXPECT_THAT(svg, HasSubstr(">Pipeline timeline — iteration 29.2 s, bubble 37.7%<"));
  EXPECT_THAT(svg, HasSubstr(">time (s)</text>"));
}

// A stage of many replicas and tensor ranks is named by all its worker
// ids: the whole name is in the lane's tooltip once, and each box's
// tooltip has it cut (tens of thousands of boxes repeating kilobytes each
// once passed GetPlan's 64 MiB reply).
TEST(TimelineRenderTest, TimelineSvg_LongWorkerName_WholeOnceInTheLaneCutInBoxes) {
  const SimulationResult result = TwoStageOneFOneB();
  std::string long_name;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&long_name, i == 0 ? "" : "+", "w-", i);
  const std::string svg = TimelineSvg(result, {long_name, "short"});
  EXPECT_EQ(CheckBalancedXml(svg), "");
  EXPECT_EQ(Count(svg, long_name), 1);
  EXPECT_EQ(Count(svg, absl::StrCat("<title>", long_name, "</title>")), 1);
  const std::string in_boxes = absl::StrCat("<title>", long_name.substr(0, 63), "…: ");
  EXPECT_GT(Count(svg, in_boxes), 4);  // worker 0's forward and backward boxes at least
  EXPECT_EQ(Count(svg, ">short</text>"), 1);
  EXPECT_GT(Count(svg, "<title>short: "), 4);
}

// A worker's trace may say its step took any time in (0, 1e6] s, 5e-324
// (the least double) too: the axis of such a span once had a tick step of
// 0 and its loop never ended. Every span draws a bounded axis.
TEST(TimelineRenderTest, TimelineSvg_TinyAndHugeSpans_DrawAFewTicks) {
  for (const double span :
       {std::numeric_limits<double>::denorm_min(), 1e-310, 1e-300, 1e-15, 1e-9, 1e-6, 1e6, 1e300}) {
    SimulationResult result;
    TimelineEvent e;
    e.worker = 0;
    e.kind = TimelineEventKind::kForward;
    e.end_seconds = span;
    result.events.push_back(e);
    result.iteration_seconds = span;
    const std::string svg = TimelineSvg(result, {"w-1"});
    EXPECT_EQ(CheckBalancedXml(svg), "") << span;
    const int ticks = Count(svg, "stroke=\"#dddddd\"");
    EXPECT_GE(ticks, 2) << span;
    EXPECT_LE(ticks, 16) << span;
  }
}

TEST(TimelineRenderTest, TimelineSvg_OptionsOff_NoTransfersOrWaits) {
  TimelineSvgOptions options;
  options.show_transfers = false;
  options.show_waits = false;
  options.title = "T";
  const std::string svg = TimelineSvg(TwoStageOneFOneB(), {}, options);
  EXPECT_EQ(CheckBalancedXml(svg), "");
  EXPECT_EQ(Count(svg, "url(#wait-hatch)\""), 0);
  EXPECT_EQ(Count(svg, "send ACTIVATION"), 0);
  EXPECT_THAT(svg, HasSubstr(">T — iteration"));
}

// Data-parallel all-reduces are worker time: on the compute thread, drawn
// as "AR" boxes with their own legend entry.
// TwoStageOneFOneB's programs and units (1000 gradient bytes each), as two
// replicas over `replica_link`, their all-reduce in buckets of
// `bucket_bytes` (0: at the step).
SimulationResult TwoReplicas(const LinkParameters& replica_link, double bucket_bytes) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value();
  SimulationCosts costs;
  costs.units.assign(4, UnitSimulationCost{1, 2, 100, 1000});
  costs.worker_speeds = {1, 1};
  costs.link.bandwidth_bytes_per_second = 100;
  costs.data_parallel = 2;
  costs.replica_link = replica_link;
  costs.all_reduce_bucket_bytes = bucket_bytes;
  return SimulateIteration(programs, costs).value();
}

TEST(TimelineRenderTest, AllReduce_OnComputeThreadWithBytesAndLegend) {
  const SimulationResult result = TwoReplicas({1000, 0}, 0);  // 2000 B: 2 s per stage
  const auto trace = nlohmann::json::parse(ChromeTraceJson(result, {}));
  int all_reduces = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("cat") != "all-reduce") continue;
    ++all_reduces;
    EXPECT_EQ(e.at("tid"), 0);
    EXPECT_EQ(e.at("dur"), 2e6);
    EXPECT_EQ(e.at("args").at("bytes"), 2000);
  }
  EXPECT_EQ(all_reduces, 2);
  const std::string svg = TimelineSvg(result, {});
  EXPECT_EQ(CheckBalancedXml(svg), "");
  EXPECT_EQ(Count(svg, ">all-reduce<"), 1);
  EXPECT_EQ(Count(svg, ">AR<"), 2);
  EXPECT_EQ(Count(TimelineSvg(TwoStageOneFOneB(), {}), ">all-reduce<"), 0);
}

// Overlapped buckets run beside compute: a thin row under the worker's
// lane and a thread of their own in the trace, with a legend entry; the
// step's wait for them is an "AR" box like the all-reduce it waits for.
TEST(TimelineRenderTest, AllReduceBuckets_OnTheirOwnRowAndThread) {
  // A 1000 B bucket: 10 s, longer than what follows it.
  const SimulationResult result = TwoReplicas({100, 0}, 1000);
  const auto trace = nlohmann::json::parse(ChromeTraceJson(result, {}));
  int buckets = 0, waits = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    if (e.at("cat") == "all-reduce-bucket") {
      ++buckets;
      EXPECT_NE(e.at("tid"), 0);
      EXPECT_EQ(e.at("args").at("bytes"), 1000);
    }
    if (e.at("cat") == "all-reduce-wait") {
      ++waits;
      EXPECT_EQ(e.at("tid"), 0);
    }
  }
  EXPECT_EQ(buckets, 4);  // two units per stage
  EXPECT_EQ(waits, 2);
  const std::string svg = TimelineSvg(result, {});
  EXPECT_EQ(CheckBalancedXml(svg), "");
  EXPECT_EQ(Count(svg, ">all-reduce bucket (overlapped)<"), 1);
  EXPECT_EQ(Count(svg, ">all-reduce<"), 1);
  EXPECT_EQ(Count(svg, ">AR<"), 2);
}

// A CPU job with tensor and data parallelism runs a backward pass's
// tensor-parallel all-reduces while its buckets all-reduce: each kind has
// a row of its own, under the transfer rows.
TEST(TimelineRenderTest, TensorParallelAndBucketBars_OnDifferentRows) {
  SimulationResult result;
  result.busy_seconds = {1};
  result.iteration_seconds = 1;
  result.events.push_back({0, TimelineEventKind::kBackward, 0, 1, 0, Range{0, 2}});
  result.events.back().label = "B mb0 [0,2)";
  result.events.push_back({0, TimelineEventKind::kTensorParallelAllReduce, 0.2, 0.4, 0, {1, 2}});
  result.events.back().label = "tp bar";
  result.events.push_back({0, TimelineEventKind::kAllReduceBucket, 0.2, 0.5, -1, Range{1, 2}});
  result.events.back().label = "bucket bar";
  const std::string svg = TimelineSvg(result, {});
  ASSERT_EQ(CheckBalancedXml(svg), "");
  // The y of the rect whose tooltip names `label`.
  const auto y_of = [&svg](const std::string& label) {
    const size_t title = svg.find(absl::StrCat("worker 0: ", label, ","));
    EXPECT_NE(title, std::string::npos) << label;
    const size_t rect = svg.rfind("<rect ", title);
    const size_t y = svg.find(" y=\"", rect) + 4;
    return std::stod(svg.substr(y, svg.find('"', y) - y));
  };
  const double box = y_of("B mb0 [0,2)"), tp = y_of("tp bar"), bucket = y_of("bucket bar");
  EXPECT_GT(tp, box);
  EXPECT_GE(bucket, tp + 4);  // below the 4 px tensor-parallel row
}

// Writes the documentation example (see the top of this file).
TEST(TimelineRenderTest, Example_FourWorkerOneFOneB_WritesSvgAndTrace) {
  const SimulationResult result = FourWorkerExample();
  TimelineSvgOptions options;
  options.title = "GPT-2 small, 4 workers, 1F1B, 8 micro-batches";
  const std::vector<std::string> names = {"worker-0", "worker-1", "worker-2", "worker-3"};
  const std::string svg = TimelineSvg(result, names, options);
  ASSERT_EQ(CheckBalancedXml(svg), "");
  EXPECT_EQ(Count(svg, ">busy "), 4);
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string dir = workspace != nullptr ? absl::StrCat(workspace, "/docs/images")
                                               : std::string(std::getenv("TEST_TMPDIR"));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/timeline-example.svg") << svg;
  std::ofstream(dir + "/timeline-example.json") << ChromeTraceJson(result, names);
  std::ifstream check(dir + "/timeline-example.svg");
  EXPECT_TRUE(check.good()) << "could not write " << dir;
}

}  // namespace
}  // namespace pipetrain
