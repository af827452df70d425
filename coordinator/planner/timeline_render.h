// Renders a simulated (or measured) iteration timeline for people:
// Chrome trace JSON for chrome://tracing / Perfetto, and a self-contained SVG
// for docs, the `pipetrain plan` command and the REST API (DESIGN.md §5).
//
// Both take the worker count from result.busy_seconds.size(). worker_names[w]
// names lane w; missing or empty entries become "worker w".
//
// Thread-safety: pure functions; call them from any thread.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_TIMELINE_RENDER_H_
#define PIPETRAIN_COORDINATOR_PLANNER_TIMELINE_RENDER_H_

#include <string>
#include <vector>

#include "coordinator/planner/simulator.h"

namespace pipetrain {

// Chrome trace event format ({"traceEvents": [...]}, complete "X" events):
//  - pid = worker index, named by a process_name metadata event and sorted
//    by index (process_sort_index).
//  - tid 0, "compute": forward, backward, recompute, all-reduce, optimizer,
//    recv-wait and (measured timelines) send-handoff events (a worker does
//    one thing at a time, so they never overlap).
//  - tid 1 + peer, "send to <peer name>": transfers on link (worker -> peer);
//    a link carries one transfer at a time, so these never overlap either.
//  - tid 2^20, "tensor-parallel all-reduce": a tensor-parallel job's unit
//    all-reduces (they run one at a time on the group's lane).
//    One thread per link rather than flow events: every viewer shows them.
//  - tid 2^20 + 1, "data-parallel all-reduce buckets": the buckets a
//    data-parallel job's all-reduce overlaps with backward passes.
//  - ts and dur in microseconds; name = the event's label ("F mb3 [2,5)");
//    cat = TimelineEventKindName; args: units "[b,e)", micro_batch (-1 for
//    per-iteration work), for transfers and waits tensor, peer, bytes, and
//    for all-reduces bytes.
//  - "otherData": iteration_seconds and bubble_fraction.
// Zero-length events (free instructions) are kept, with dur 0.
std::string ChromeTraceJson(const SimulationResult& result,
                            const std::vector<std::string>& worker_names);

struct TimelineSvgOptions {
  std::string title = "Pipeline timeline";
  // What result.iteration_seconds is called in the title line.
  std::string span_name = "iteration";
  int width_px = 1400;         // of the whole image; at least 400 is used
  bool show_transfers = true;  // thin bars under each lane
  bool show_waits = true;      // hatched boxes where a worker waits in a recv
};

// A self-contained SVG document (no scripts, fonts or external references):
// a title line with the iteration time (options.span_name) and bubble
// fraction, a legend, one
// lane per worker with its name and busy share, compute boxes coloured by
// kind (forward, backward, recompute, all-reduce, optimizer; a measured
// timeline's send hand-offs) with "F3" /
// "B3" / "R3" micro-batch labels ("AR", "opt" for the per-iteration boxes)
// where they fit, hatched recv waits, transfers as thin
// bars under the lane coloured by tensor kind (sends to higher-numbered
// workers on the upper row, to lower-numbered on the lower row), a tensor-
// parallel job's all-reduces as thin bars on a third row, the data-
// parallel all-reduce's overlapped buckets on a fourth, and a time
// axis with ticks labelled in µs, ms or s. Hovering a box shows its label and
// times (<title> tooltips). Zero-length events are not drawn.
std::string TimelineSvg(const SimulationResult& result,
                        const std::vector<std::string>& worker_names,
                        const TimelineSvgOptions& options = TimelineSvgOptions());

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_TIMELINE_RENDER_H_
