// Where a measured step went, pass by pass: the workers' traced step
// (Plan.measured_chrome_trace_json) next to the plan's prediction
// (Plan.chrome_trace_json), summed per worker and kind of work. The
// per-worker busy/waiting table (stage_times.h) says which worker is off;
// this says whether its forward passes, backward passes, optimizer step or
// waits are.
#ifndef PIPETRAIN_CLI_PASS_TIMES_H_
#define PIPETRAIN_CLI_PASS_TIMES_H_

#include <string>

#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// A header line and one line per measured worker (at most
// kMaxPassTimeRows, then "... and N more"), milliseconds in the step:
//   "passes in step 711 as the workers measured it [predicted], ms: forward,
//    backward, optimizer, sends, waiting\n" (one line)
//   "  w-2       6.18 [6.39]      13.97 [11.06]      0.23 [0.12]       2.80 [-]
//          8.71 [6.60]\n" (one line)
// forward and backward include recomputes under backward; sends is the
// hand-off of each send to the data plane (no prediction: the simulation
// counts it in the data plane's CPU demand, off the lane); waiting is
// the receives' waits and the data-parallel all-reduce inside the step
// (predicted: its all-reduce events, the step's and the fused embedding
// sync's; measured: the waits for it and the fused sync), so not the idle
// time at a step's end that stage_times.h's predicted waiting counts.
// The prediction draws one lane per stage position, named by all the
// workers there ("w-1,w-3": its replicas, or its tensor ranks), so each
// of them is shown that lane's figures; a worker on no predicted lane has
// "[-]". Empty without a measured step, or when either
// trace does not parse as timeline_render.h writes them.
std::string FormatPassTimes(const v1::Plan& plan);

inline constexpr int kMaxPassTimeRows = 32;

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_PASS_TIMES_H_
