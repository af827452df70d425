#include "cli/pass_times.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string Name(int pid, const std::string& name) {
  return absl::StrCat(R"({"ph":"M","name":"process_name","pid":)", pid,
                      R"(,"tid":0,"args":{"name":")", name, R"("}})");
}

std::string Event(int pid, int tid, const std::string& cat, double dur_us) {
  return absl::StrCat(R"({"ph":"X","pid":)", pid, R"(,"tid":)", tid, R"(,"cat":")", cat,
                      R"(","name":"x","ts":0,"dur":)", dur_us, "}");
}

std::string Trace(const std::vector<std::string>& events) {
  std::string out = R"({"traceEvents":[)";
  for (size_t i = 0; i < events.size(); ++i) absl::StrAppend(&out, i ? "," : "", events[i]);
  return out + "]}";
}

v1::Plan TwoWorkerPlan() {
  v1::Plan plan;
  plan.add_stages()->set_worker_id("w-1");
  plan.add_stages()->set_worker_id("w-2");
  plan.set_chrome_trace_json(Trace({Name(0, "w-1"), Name(1, "w-2"), Event(0, 0, "forward", 600),
                                    Event(0, 0, "backward", 1000), Event(0, 0, "recv-wait", 300),
                                    Event(1, 0, "forward", 1500), Event(1, 0, "backward", 2500),
                                    Event(1, 0, "optimizer", 100),
                                    // a transfer lane: not the worker's time
                                    Event(0, 2, "send", 5000)}));
  return plan;
}

TEST(FormatPassTimes, MeasuredNextToPredictedPerWorkerAndKind) {
  v1::Plan plan = TwoWorkerPlan();
  plan.set_measured_step(110);
  // The measured lanes in another order; recompute counts as backward,
  // the all-reduce wait as waiting; the third lane (another replica) has
  // no prediction.
  plan.set_measured_chrome_trace_json(Trace(
      {Name(0, "w-2"), Name(1, "w-1"), Name(2, "w-3"), Event(0, 0, "forward", 1540),
       Event(0, 0, "backward", 3000), Event(0, 0, "recompute", 490), Event(0, 0, "optimizer", 230),
       Event(0, 0, "all-reduce-wait", 1000), Event(0, 0, "send-handoff", 150),
       Event(0, 0, "send-handoff", 200), Event(1, 0, "forward", 620), Event(1, 0, "recv-wait", 250),
       Event(1, 0, "recv-wait", 250), Event(2, 0, "forward", 10)}));
  EXPECT_EQ(FormatPassTimes(plan),
            "passes in step 111 as the workers measured it [predicted], ms: forward, backward, "
            "optimizer, sends, waiting\n"
            "  w-1       0.62 [0.60]       0.00 [1.00]       0.00 [0.00]       0.00 [-]          "
            "0.50 [0.30]\n"
            "  w-2       1.54 [1.50]       3.49 [2.50]       0.23 [0.10]       0.35 [-]          "
            "1.00 [0.00]\n"
            "  w-3       0.01 [-]          0.00 [-]          0.00 [-]          0.00 [-]          "
            "0.00 [-]\n");
}

// A GPU replica's data-parallel all-reduce runs at the step: the
// prediction's "all-reduce" event is the time its workers measure as a
// wait for it ("all-reduce-wait"), both waiting.
TEST(FormatPassTimes, GpuDataParallelAllReduce_PredictedAsWaiting) {
  v1::Plan plan;
  plan.add_stages()->set_worker_id("w-1");
  plan.set_chrome_trace_json(Trace({Name(0, "w-1,w-2"), Event(0, 0, "forward", 500),
                                    Event(0, 0, "all-reduce", 1000)}));
  plan.set_measured_chrome_trace_json(
      Trace({Name(0, "w-1"), Event(0, 0, "forward", 600), Event(0, 0, "all-reduce-wait", 1000)}));
  const std::string text = FormatPassTimes(plan);
  EXPECT_NE(text.find("  w-1       0.60 [0.50]       0.00 [0.00]       0.00 [0.00]       0.00 [-]"
                      "          1.00 [1.00]\n"),
            std::string::npos)
      << text;
}

// With replicas the prediction's lane of a stage position is named by all
// its workers; each of them is compared with it.
TEST(FormatPassTimes, ReplicasShareTheirPositionsPredictedLane) {
  v1::Plan plan;
  for (const char* w : {"w-1", "w-2", "w-3", "w-4"}) plan.add_stages()->set_worker_id(w);
  plan.set_chrome_trace_json(Trace({Name(0, "w-1,w-3"), Name(1, "w-2,w-4"),
                                    Event(0, 0, "forward", 1000), Event(1, 0, "forward", 2000)}));
  plan.set_measured_chrome_trace_json(Trace(
      {Name(0, "w-1"), Name(1, "w-2"), Name(2, "w-3"), Name(3, "w-4"), Event(0, 0, "forward", 1100),
       Event(1, 0, "forward", 2100), Event(2, 0, "forward", 1200), Event(3, 0, "forward", 2200)}));
  const std::string text = FormatPassTimes(plan);
  EXPECT_NE(text.find("  w-3       1.20 [1.00]"), std::string::npos) << text;
  EXPECT_NE(text.find("  w-4       2.20 [2.00]"), std::string::npos) << text;
}

// A tensor group's ranks are one lane, joined by '+', and replicas of it
// by ',': every rank of every replica is compared with its lane.
TEST(FormatPassTimes, TensorRanksShareTheirGroupsPredictedLane) {
  v1::Plan plan;
  for (const char* w : {"w-1", "w-2", "w-3", "w-4"}) plan.add_stages()->set_worker_id(w);
  plan.set_chrome_trace_json(Trace({Name(0, "w-1+w-2,w-3+w-4"), Event(0, 0, "forward", 1000)}));
  plan.set_measured_chrome_trace_json(Trace(
      {Name(0, "w-1"), Name(1, "w-2"), Name(2, "w-3"), Name(3, "w-4"), Event(0, 0, "forward", 1100),
       Event(1, 0, "forward", 1200), Event(2, 0, "forward", 1300), Event(3, 0, "forward", 1400)}));
  const std::string text = FormatPassTimes(plan);
  EXPECT_NE(text.find("  w-1       1.10 [1.00]"), std::string::npos) << text;
  EXPECT_NE(text.find("  w-2       1.20 [1.00]"), std::string::npos) << text;
  EXPECT_NE(text.find("  w-4       1.40 [1.00]"), std::string::npos) << text;
}

TEST(FormatPassTimes, EmptyWithoutAMeasuredStepOrAReadableTrace) {
  v1::Plan plan = TwoWorkerPlan();
  EXPECT_EQ(FormatPassTimes(plan), "");
  for (const char* bad : {"{", "[]", R"({"traceEvents": 3})", "null"}) {
    plan.set_measured_chrome_trace_json(bad);
    EXPECT_EQ(FormatPassTimes(plan), "") << bad;
  }
  plan.set_measured_chrome_trace_json(plan.chrome_trace_json());
  plan.set_chrome_trace_json("not json");
  EXPECT_EQ(FormatPassTimes(plan), "");
}

// Fields of another type than a trace's (a name that is a number, a tid
// that is a string) skip their events instead of throwing.
TEST(FormatPassTimes, FieldsOfTheWrongType_EventsSkippedNoThrow) {
  v1::Plan plan = TwoWorkerPlan();
  plan.set_measured_chrome_trace_json(
      Trace({R"({"ph":"M","name":5,"pid":0,"args":{"name":"w-1"}})",
             R"({"ph":"X","pid":0,"tid":"zero","cat":"forward","dur":100})",
             R"({"ph":"X","pid":0,"tid":null,"cat":"forward","dur":100})"}));
  EXPECT_NO_THROW(FormatPassTimes(plan));
}

TEST(FormatPassTimes, ManyWorkers_RowsCapped) {
  v1::Plan plan = TwoWorkerPlan();
  std::vector<std::string> events;
  for (int w = 0; w < kMaxPassTimeRows + 3; ++w) {
    events.push_back(Name(w, absl::StrCat("worker-", 100 + w)));
    events.push_back(Event(w, 0, "forward", 1000));
  }
  plan.set_measured_chrome_trace_json(Trace(events));
  const std::string text = FormatPassTimes(plan);
  EXPECT_NE(text.find("  ... and 3 more\n"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1 + kMaxPassTimeRows + 1);
}

}  // namespace
}  // namespace pipetrain
