#include "coordinator/planner/timeline_render.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/enum_names.h"
#include "common/utf8_prefix.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

int WorkerCount(const SimulationResult& result) {
  return static_cast<int>(result.busy_seconds.size());
}

std::string WorkerName(const std::vector<std::string>& names, int w) {
  if (w < static_cast<int>(names.size()) && !names[w].empty()) return names[w];
  return absl::StrCat("worker ", w);
}

// A collective on a lane of its own beside the worker's compute: a
// tensor-parallel all-reduce, or a bucket of the data-parallel one.
bool OnCollectiveLane(TimelineEventKind kind) {
  return kind == TimelineEventKind::kTensorParallelAllReduce ||
         kind == TimelineEventKind::kAllReduceBucket;
}

// Worker time drawn as a box with a label: compute and the data-parallel
// all-reduce at the step (which occupies the worker like compute does).
bool IsCompute(TimelineEventKind kind) {
  return kind != TimelineEventKind::kSendTransfer && kind != TimelineEventKind::kRecvWait &&
         !OnCollectiveLane(kind);
}

// The Chrome trace threads of a worker's tensor-parallel all-reduces and
// data-parallel buckets (its sends use 1 + peer).
constexpr int kTensorParallelTid = 1 << 20;
constexpr int kDataParallelBucketTid = kTensorParallelTid + 1;

// The box label's prefix ("F3", "opt", "AR").
const char* BoxLetter(TimelineEventKind kind) {
  switch (kind) {
    case TimelineEventKind::kForward:
      return "F";
    case TimelineEventKind::kBackward:
      return "B";
    case TimelineEventKind::kRecompute:
      return "R";
    case TimelineEventKind::kOptimizer:
      return "opt";
    case TimelineEventKind::kAllReduce:
    case TimelineEventKind::kAllReduceWait:
      return "AR";
    case TimelineEventKind::kAllReduceCpu:
      return "cod";
    case TimelineEventKind::kSendHandoff:
      return "s";
    case TimelineEventKind::kSendTransfer:
    case TimelineEventKind::kRecvWait:
    case TimelineEventKind::kTensorParallelAllReduce:
    case TimelineEventKind::kAllReduceBucket:
      break;
  }
  return "";
}

// ---------------------------------------------------------------- Chrome trace

nlohmann::json Metadata(const char* name, int pid, int tid, const nlohmann::json& args) {
  return {{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"args", args}};
}

nlohmann::json TraceEvent(const TimelineEvent& e) {
  const bool transfer = e.kind == TimelineEventKind::kSendTransfer;
  nlohmann::json args = {
      {"units", absl::StrCat("[", e.units.begin, ",", e.units.end, ")")},
      {"micro_batch", e.micro_batch},
  };
  const bool tensor_parallel = e.kind == TimelineEventKind::kTensorParallelAllReduce;
  const bool bucket = e.kind == TimelineEventKind::kAllReduceBucket;
  if (!IsCompute(e.kind) && !OnCollectiveLane(e.kind)) {
    args["tensor"] = EnumShortName(e.tensor_kind);
    args["peer"] = e.peer;
  }
  if (transfer || bucket || e.kind == TimelineEventKind::kAllReduce) args["bytes"] = e.bytes;
  return {{"ph", "X"},
          {"name", e.label},
          {"cat", TimelineEventKindName(e.kind)},
          {"pid", e.worker},
          {"tid", transfer          ? 1 + e.peer
                  : tensor_parallel ? kTensorParallelTid
                  : bucket          ? kDataParallelBucketTid
                                    : 0},
          {"ts", e.start_seconds * 1e6},
          {"dur", (e.end_seconds - e.start_seconds) * 1e6},
          {"args", std::move(args)}};
}

}  // namespace

std::string ChromeTraceJson(const SimulationResult& result,
                            const std::vector<std::string>& worker_names) {
  nlohmann::json events = nlohmann::json::array();
  std::set<std::pair<int, int>> links;
  std::set<int> tensor_parallel, buckets;  // workers with a collective lane
  for (const TimelineEvent& e : result.events) {
    events.push_back(TraceEvent(e));
    if (e.kind == TimelineEventKind::kSendTransfer) links.insert({e.worker, e.peer});
    if (e.kind == TimelineEventKind::kTensorParallelAllReduce) tensor_parallel.insert(e.worker);
    if (e.kind == TimelineEventKind::kAllReduceBucket) buckets.insert(e.worker);
  }
  for (int w : tensor_parallel) {
    events.push_back(
        Metadata("thread_name", w, kTensorParallelTid, {{"name", "tensor-parallel all-reduce"}}));
  }
  for (int w : buckets) {
    events.push_back(Metadata("thread_name", w, kDataParallelBucketTid,
                              {{"name", "data-parallel all-reduce buckets"}}));
  }
  for (int w = 0; w < WorkerCount(result); ++w) {
    events.push_back(Metadata("process_name", w, 0, {{"name", WorkerName(worker_names, w)}}));
    events.push_back(Metadata("process_sort_index", w, 0, {{"sort_index", w}}));
    events.push_back(Metadata("thread_name", w, 0, {{"name", "compute"}}));
  }
  for (const auto& [src, dst] : links) {
    events.push_back(Metadata("thread_name", src, 1 + dst,
                              {{"name", "send to " + WorkerName(worker_names, dst)}}));
  }
  nlohmann::json trace = {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"iteration_seconds", result.iteration_seconds},
        {"bubble_fraction", result.bubble_fraction}}},
  };
  // Replace invalid UTF-8 (e.g. in a worker name) instead of throwing.
  return trace.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ------------------------------------------------------------------------ SVG

namespace {

constexpr double kLanesTop = 78;      // below the title and legend
constexpr double kBoxHeight = 26;     // compute boxes
constexpr double kTransferGap = 3;    // between boxes and transfer rows
constexpr double kTransferRow = 5;    // height of one transfer row
// The tensor-parallel all-reduce row, under the two transfer rows, and
// the data-parallel buckets' under it: both can run during a backward
// pass (a CPU job with tensor and data parallelism).
constexpr double kTensorParallelTop = kBoxHeight + kTransferGap + 2 * (kTransferRow + 1);
constexpr double kCollectiveRow = 4;
constexpr double kBucketTop = kTensorParallelTop + kCollectiveRow + 1;
constexpr double kLanePitch = 59;     // lane to lane
constexpr double kAxisHeight = 34;    // ticks, labels and the axis caption
constexpr double kRightMargin = 28;   // room for the last tick label
constexpr double kCharWidth11 = 6.4;  // average glyph width of 11 px sans text
constexpr double kCharWidth13 = 7.6;
constexpr size_t kMaxNameChars = 24;  // longer worker names are cut with "…"
// In each box's tooltip, which repeats the lane's name: a stage of many
// replicas and tensor ranks is named by all its worker ids (kilobytes),
// and the SVG holds up to tens of thousands of boxes. The lane's own
// tooltip has the whole name.
constexpr size_t kMaxTooltipNameChars = 64;

// `name`, cut to `max_chars` with "…" when longer.
std::string CutName(const std::string& name, size_t max_chars) {
  if (name.size() <= max_chars) return name;
  return absl::StrCat(Utf8Prefix(name, max_chars - 1), "…");
}

const char* FillOf(const TimelineEvent& e) {
  switch (e.kind) {
    case TimelineEventKind::kForward:
      return "#4e79a7";
    case TimelineEventKind::kBackward:
      return "#f28e2b";
    case TimelineEventKind::kRecompute:
      return "#b07aa1";
    case TimelineEventKind::kOptimizer:
      return "#59a14f";
    case TimelineEventKind::kAllReduce:
    case TimelineEventKind::kAllReduceWait:
      return "#e15759";
    case TimelineEventKind::kAllReduceCpu:
      return "#9c755f";
    case TimelineEventKind::kRecvWait:
      return "url(#wait-hatch)";
    case TimelineEventKind::kTensorParallelAllReduce:
      return "#76b7b2";
    case TimelineEventKind::kAllReduceBucket:
      return "#ff9d9a";
    case TimelineEventKind::kSendHandoff:
      return "#bab0ac";
    case TimelineEventKind::kSendTransfer:
      break;
  }
  switch (e.tensor_kind) {
    case v1::TENSOR_KIND_ACTIVATION:
      return "#2f5d8a";
    case v1::TENSOR_KIND_ACTIVATION_GRAD:
      return "#c4661a";
    case v1::TENSOR_KIND_UNIT_WEIGHTS:
      return "#3d7a36";
    default:
      return "#6b6b6b";
  }
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A duration in the most readable unit, e.g. "12.5 ms".
std::string FormatDuration(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.3g µs", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.4g ms", seconds * 1e3);
  return absl::StrFormat("%.4g s", seconds);
}

struct TimeAxis {
  double step = 1;   // seconds between ticks (1, 2 or 5 times a power of 10)
  double scale = 1;  // tick labels show seconds * scale
  const char* unit = "s";
};

// The shortest span the axis is drawn for: a shorter one (a worker's
// trace may say its step took 5e-324 s) is drawn at this scale, since
// span / 8 can underflow to 0, whose logarithm would make the tick step
// 0 and the tick loop endless.
constexpr double kShortestSpanSeconds = 1e-9;
// The most ticks the axis draws, whatever the step (about eight are chosen).
constexpr int kMostTicks = 32;

// About eight ticks across [0, span], span >= kShortestSpanSeconds.
TimeAxis ChooseAxis(double span) {
  TimeAxis axis;
  const double raw = span / 8;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double n = raw / magnitude;
  axis.step = (n < 1.5 ? 1 : n < 3.5 ? 2 : n < 7.5 ? 5 : 10) * magnitude;
  if (span < 10e-3) {
    axis.scale = 1e6, axis.unit = "µs";
  } else if (span < 10) {
    axis.scale = 1e3, axis.unit = "ms";
  }
  return axis;
}

std::string Fixed(double x) { return absl::StrFormat("%.2f", x); }

// Builds the document; see TimelineSvg in the header for what it draws.
class SvgTimeline {
 public:
  SvgTimeline(const SimulationResult& result, const std::vector<std::string>& names,
              const TimelineSvgOptions& options)
      : result_(result), options_(options), workers_(WorkerCount(result)) {
    size_t longest = 9;  // "busy 100%"
    for (int w = 0; w < workers_; ++w) {
      names_.push_back(WorkerName(names, w));
      tooltip_names_.push_back(CutName(names_.back(), kMaxTooltipNameChars));
      longest = std::max(longest, names_.back().size());
    }
    left_ = std::max(24 + std::min(longest, kMaxNameChars) * kCharWidth13, 90.0);
    width_ = std::max(options.width_px, 400);
    height_ = kLanesTop + workers_ * kLanePitch + kAxisHeight;
    span_ =
        result.iteration_seconds > 0 ? std::max(result.iteration_seconds, kShortestSpanSeconds) : 1;
    axis_ = ChooseAxis(span_);
  }

  std::string Render() {
    absl::StrAppend(&out_, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width_,
                    "\" height=\"", Fixed(height_), "\" viewBox=\"0 0 ", width_, " ",
                    Fixed(height_), "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n");
    out_ +=
        "<defs><pattern id=\"wait-hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
        "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f3f3f3\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#c8c8c8\" stroke-width=\"2\"/>"
        "</pattern></defs>\n";
    absl::StrAppend(&out_, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    Title();
    Legend();
    Lanes();
    Axis();
    for (const TimelineEvent& e : result_.events) Event(e);
    out_ += "</svg>\n";
    return out_;
  }

 private:
  double X(double seconds) const {
    return left_ + seconds / span_ * (width_ - left_ - kRightMargin);
  }
  double LaneTop(int w) const { return kLanesTop + w * kLanePitch; }
  double LanesBottom() const { return LaneTop(workers_) - 6; }

  // A label; with a non-empty `hover`, that text shows on hover (a tooltip).
  void Text(double x, double y, const std::string& text, const std::string& attributes,
            const std::string& hover = "") {
    absl::StrAppend(&out_, "<text x=\"", Fixed(x), "\" y=\"", Fixed(y), "\" ", attributes, ">");
    if (!hover.empty()) absl::StrAppend(&out_, "<title>", Escape(hover), "</title>");
    absl::StrAppend(&out_, Escape(text), "</text>\n");
  }

  void Title() {
    Text(12, 26,
         absl::StrFormat("%s — %s %s, bubble %.1f%%", options_.title, options_.span_name,
                         FormatDuration(result_.iteration_seconds), 100 * result_.bubble_fraction),
         "font-size=\"17\" font-weight=\"bold\" fill=\"#222222\"");
  }

  void LegendItem(double* x, const std::string& fill, double height, const std::string& name) {
    absl::StrAppend(&out_, "<rect x=\"", Fixed(*x), "\" y=\"", Fixed(55 - height / 2),
                    "\" width=\"14\" height=\"", Fixed(height), "\" fill=\"", fill,
                    "\" stroke=\"#999999\" stroke-width=\"0.5\"/>\n");
    Text(*x + 19, 59, name, "font-size=\"12\" fill=\"#333333\"");
    *x += 19 + name.size() * 6.8 + 18;
  }

  void Legend() {
    std::set<TimelineEventKind> kinds;
    std::set<v1::TensorKind> tensors;
    for (const TimelineEvent& e : result_.events) {
      kinds.insert(e.kind);
      if (e.kind == TimelineEventKind::kSendTransfer) tensors.insert(e.tensor_kind);
    }
    // The wait for the buckets is drawn as the all-reduce it waits for.
    if (kinds.count(TimelineEventKind::kAllReduceWait)) kinds.insert(TimelineEventKind::kAllReduce);
    double x = 12;
    TimelineEvent probe;
    for (TimelineEventKind k :
         {TimelineEventKind::kForward, TimelineEventKind::kBackward, TimelineEventKind::kRecompute,
          TimelineEventKind::kAllReduce, TimelineEventKind::kAllReduceCpu,
          TimelineEventKind::kOptimizer, TimelineEventKind::kSendHandoff}) {
      probe.kind = k;
      if (k == TimelineEventKind::kForward || k == TimelineEventKind::kBackward || kinds.count(k)) {
        LegendItem(&x, FillOf(probe), 14, TimelineEventKindName(k));
      }
    }
    if (options_.show_waits) {
      probe.kind = TimelineEventKind::kRecvWait;
      LegendItem(&x, FillOf(probe), 14, "waiting in recv");
    }
    if (kinds.count(TimelineEventKind::kTensorParallelAllReduce)) {
      probe.kind = TimelineEventKind::kTensorParallelAllReduce;
      LegendItem(&x, FillOf(probe), kCollectiveRow, "tensor-parallel all-reduce");
    }
    if (kinds.count(TimelineEventKind::kAllReduceBucket)) {
      probe.kind = TimelineEventKind::kAllReduceBucket;
      LegendItem(&x, FillOf(probe), kCollectiveRow, "all-reduce bucket (overlapped)");
    }
    if (!options_.show_transfers) return;
    probe.kind = TimelineEventKind::kSendTransfer;
    for (v1::TensorKind t : tensors) {
      probe.tensor_kind = t;
      const std::string name = t == v1::TENSOR_KIND_ACTIVATION        ? "send activation"
                               : t == v1::TENSOR_KIND_ACTIVATION_GRAD ? "send gradient"
                               : t == v1::TENSOR_KIND_UNIT_WEIGHTS    ? "send weights"
                                                                      : "send tied grad";
      LegendItem(&x, FillOf(probe), kTransferRow, name);
    }
  }

  void Lanes() {
    for (int w = 0; w < workers_; ++w) {
      const double top = LaneTop(w);
      if (w % 2 == 1) {
        absl::StrAppend(&out_, "<rect x=\"0\" y=\"", Fixed(top - 6), "\" width=\"", width_,
                        "\" height=\"", Fixed(kLanePitch), "\" fill=\"#f7f7f7\"/>\n");
      }
      const bool cut = names_[w].size() > kMaxNameChars;  // with the whole name on hover
      Text(12, top + 13, cut ? CutName(names_[w], kMaxNameChars) : names_[w],
           "font-size=\"13\" fill=\"#222222\"", cut ? names_[w] : "");
      const double busy =
          result_.iteration_seconds > 0 ? result_.busy_seconds[w] / result_.iteration_seconds : 0;
      Text(12, top + 29, absl::StrFormat("busy %.0f%%", 100 * busy),
           "font-size=\"11\" fill=\"#666666\"");
    }
  }

  void Axis() {
    const double bottom = LanesBottom();
    for (int k = 0; k <= kMostTicks && k * axis_.step <= span_ * (1 + 1e-9); ++k) {
      const double x = X(k * axis_.step);
      absl::StrAppend(&out_, "<line x1=\"", Fixed(x), "\" y1=\"", Fixed(kLanesTop - 6), "\" x2=\"",
                      Fixed(x), "\" y2=\"", Fixed(bottom + 5),
                      "\" stroke=\"#dddddd\" stroke-width=\"1\"/>\n");
      Text(x, bottom + 18, absl::StrFormat("%.6g", k * axis_.step * axis_.scale),
           "font-size=\"11\" fill=\"#444444\" text-anchor=\"middle\"");
    }
    absl::StrAppend(&out_, "<line x1=\"", Fixed(X(0)), "\" y1=\"", Fixed(bottom), "\" x2=\"",
                    Fixed(X(span_)), "\" y2=\"", Fixed(bottom),
                    "\" stroke=\"#444444\" stroke-width=\"1\"/>\n");
    Text(12, bottom + 18, absl::StrCat("time (", axis_.unit, ")"),
         "font-size=\"11\" fill=\"#444444\"");
  }

  void Event(const TimelineEvent& e) {
    // Zero-length events are not drawn (the header). Among them are the
    // transfers on a link of unlimited bandwidth whose messages carry no
    // data plane's per-message cost (simulator.h: a send holds its link for
    // that cost plus its bytes' time, both 0 there): their latency still
    // shows as the receiver's wait, and the Chrome trace keeps them.
    if (e.end_seconds <= e.start_seconds || e.worker < 0 || e.worker >= workers_) return;
    if (e.kind == TimelineEventKind::kRecvWait && !options_.show_waits) return;
    if (e.kind == TimelineEventKind::kSendTransfer && !options_.show_transfers) return;
    const double x = X(e.start_seconds);
    const double w = std::max(X(e.end_seconds) - x, 0.5);
    double y = LaneTop(e.worker), h = kBoxHeight;
    if (e.kind == TimelineEventKind::kSendTransfer) {
      y += kBoxHeight + kTransferGap + (e.peer < e.worker ? kTransferRow + 1 : 0);
      h = kTransferRow;
    }
    const bool thin = e.kind == TimelineEventKind::kSendTransfer || OnCollectiveLane(e.kind);
    if (OnCollectiveLane(e.kind)) {
      y += e.kind == TimelineEventKind::kAllReduceBucket ? kBucketTop : kTensorParallelTop;
      h = kCollectiveRow;
    }
    const char* stroke = thin ? "none" : "#ffffff";
    absl::StrAppend(&out_, "<rect x=\"", Fixed(x), "\" y=\"", Fixed(y), "\" width=\"", Fixed(w),
                    "\" height=\"", Fixed(h), "\" fill=\"", FillOf(e), "\" stroke=\"", stroke,
                    "\" stroke-width=\"0.6\"><title>",
                    Escape(absl::StrCat(tooltip_names_[e.worker], ": ", e.label, ", ",
                                        FormatDuration(e.start_seconds), " to ",
                                        FormatDuration(e.end_seconds))),
                    "</title></rect>\n");
    if (IsCompute(e.kind)) BoxLabel(e, x, w);
  }

  // "F3" inside the box, or "3" when only that fits, or nothing.
  void BoxLabel(const TimelineEvent& e, double x, double w) {
    const std::string letter = BoxLetter(e.kind);
    std::string text = e.micro_batch >= 0 ? absl::StrCat(letter, e.micro_batch) : letter;
    if (text.size() * kCharWidth11 + 4 > w && e.micro_batch >= 0)
      text = absl::StrCat(e.micro_batch);
    if (text.size() * kCharWidth11 + 4 > w) return;
    const char* color = e.kind == TimelineEventKind::kBackward ? "#222222" : "#ffffff";
    Text(x + w / 2, LaneTop(e.worker) + kBoxHeight / 2 + 4, text,
         absl::StrCat("font-size=\"11\" fill=\"", color, "\" text-anchor=\"middle\""));
  }

  const SimulationResult& result_;
  const TimelineSvgOptions& options_;
  const int workers_;
  std::vector<std::string> names_;
  std::vector<std::string> tooltip_names_;  // names_ cut to kMaxTooltipNameChars
  double left_ = 0, height_ = 0, span_ = 1;
  int width_ = 0;
  TimeAxis axis_;
  std::string out_;
};

}  // namespace

std::string TimelineSvg(const SimulationResult& result,
                        const std::vector<std::string>& worker_names,
                        const TimelineSvgOptions& options) {
  return SvgTimeline(result, worker_names, options).Render();
}

}  // namespace pipetrain
