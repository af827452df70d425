#include "cli/pass_times.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

// The columns, and the event categories (timeline_render.h: cat =
// TimelineEventKindName) that count in each.
constexpr std::array<const char*, 5> kColumns = {"forward", "backward", "optimizer", "sends",
                                                 "waiting"};
// The simulation keeps the sends' hand-offs off the workers' lanes (it
// counts them in the data plane's CPU demand): no prediction to show.
constexpr int kSendsColumn = 3;

int ColumnOf(const std::string& category) {
  if (category == "forward") return 0;
  if (category == "backward" || category == "recompute") return 1;
  if (category == "optimizer") return 2;
  if (category == "send-handoff") return kSendsColumn;
  // The data-parallel all-reduce: the prediction's at the step (a GPU
  // replica's, or what follows the last bucket) and the workers' waits
  // for it; the fused embedding sync on both sides.
  if (category == "recv-wait" || category == "all-reduce-wait" || category == "all-reduce") {
    return 4;
  }
  return -1;
}

using Sums = std::array<double, kColumns.size()>;

// Per worker name, the milliseconds of each column on its compute lane
// (tid 0). nullopt when `text` is not such a trace.
std::optional<std::map<std::string, Sums>> SumByWorker(const std::string& text) {
  const nlohmann::json trace = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    return std::nullopt;
  }
  std::map<int64_t, std::string> names;
  std::map<int64_t, Sums> sums;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    // An integer pid: a float one outside int64's range would convert with
    // undefined behaviour.
    if (!e.is_object() || !e.contains("ph") || !e.contains("pid") ||
        !e["pid"].is_number_integer()) {
      continue;
    }
    const int64_t pid = e["pid"].get<int64_t>();
    // Compared, not json::value()'d: a field of another type in the trace
    // (the coordinator's) must skip the event, not throw.
    if (e["ph"] == "M" && e.contains("name") && e["name"] == "process_name" && e.contains("args") &&
        e["args"].is_object() && e["args"].contains("name") && e["args"]["name"].is_string()) {
      names[pid] = e["args"]["name"].get<std::string>();
    } else if (e["ph"] == "X" && e.contains("tid") && e["tid"] == 0 && e.contains("cat") &&
               e["cat"].is_string() && e.contains("dur") && e["dur"].is_number()) {
      const int column = ColumnOf(e["cat"].get<std::string>());
      if (column >= 0) sums[pid][column] += e["dur"].get<double>() / 1000;  // us -> ms
      names.emplace(pid, absl::StrCat("worker ", pid));
    }
  }
  std::map<std::string, Sums> by_name;
  for (const auto& [pid, name] : names) {
    by_name[name] = sums[pid];
    // The prediction draws one lane per stage position, named by all its
    // workers: replicas joined by ',' and a tensor group's ranks by '+'
    // ("w-1+w-2,w-3+w-4": two replicas of a stage on two ranks each).
    if (name.find_first_of(",+") == std::string::npos) continue;
    for (absl::string_view worker : absl::StrSplit(name, absl::ByAnyChar(",+"))) {
      by_name.emplace(std::string(worker), sums[pid]);
    }
  }
  return by_name;
}

}  // namespace

std::string FormatPassTimes(const v1::Plan& plan) {
  if (plan.measured_chrome_trace_json().empty()) return "";
  const auto measured = SumByWorker(plan.measured_chrome_trace_json());
  const auto predicted = SumByWorker(plan.chrome_trace_json());
  if (!measured || !predicted) return "";
  std::string out = absl::StrCat("passes in step ", plan.measured_step() + 1,
                                 " as the workers measured it [predicted], ms:");
  for (size_t c = 0; c < kColumns.size(); ++c) absl::StrAppend(&out, c ? ", " : " ", kColumns[c]);
  out += "\n";
  // The plan's worker order (stages), then any other lane.
  std::vector<std::string> order;
  for (const v1::PlanStage& s : plan.stages()) {
    if (measured->count(s.worker_id())) order.push_back(s.worker_id());
  }
  for (const auto& [name, sums] : *measured) {
    if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
  }
  size_t width = 6;
  for (const std::string& name : order) width = std::max(width, name.size());
  int rows = 0;
  for (const std::string& name : order) {
    if (rows++ == kMaxPassTimeRows) {
      absl::StrAppend(&out, "  ... and ", order.size() - kMaxPassTimeRows, " more\n");
      break;
    }
    absl::StrAppendFormat(&out, "  %-*s", static_cast<int>(width), name);
    const Sums& m = measured->at(name);
    auto p = predicted->find(name);
    for (size_t c = 0; c < kColumns.size(); ++c) {
      const std::string bracket = p == predicted->end() || c == kSendsColumn
                                      ? "[-]"
                                      : absl::StrFormat("[%.2f]", p->second[c]);
      absl::StrAppendFormat(&out, "  %-16s", absl::StrFormat("%6.2f %s", m[c], bracket));
    }
    // No trailing blanks.
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

}  // namespace pipetrain
