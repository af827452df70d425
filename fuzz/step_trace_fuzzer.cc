// The workers' step traces (ReportProgressRequest.trace, from a worker the
// coordinator cannot trust): CheckStepTrace against the worker's program,
// then, for traces it lets through, what GetPlan does with them:
// MeasuredTimeline, TimelineSvg and ChromeTraceJson.
//
// Input: two workers' serialized pipetrain.v1.StepTrace, the first
// uint16-length-prefixed, the second the rest, checked against the two
// stages of a 1F1B program of a 6-unit model in 4 micro-batches, iteration
// 10. A trace that does not parse is skipped; one CheckStepTrace refuses
// stops the input, as ReportProgress refuses the report.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/planner/measured_timeline.h"
#include "coordinator/planner/schedule_compiler.h"
#include "coordinator/planner/timeline_render.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  static const std::vector<v1::Program> programs =
      CompilePrograms({Range{0, 3}, Range{3, 6}}, 6, 4, Schedule::kOneFOneB).value();
  FuzzInput in(data, size);
  v1::StepTrace traces[2];
  const std::string_view first = in.LengthPrefixed();
  const std::string_view second = in.Rest();
  if (!traces[0].ParseFromArray(first.data(), static_cast<int>(first.size())) ||
      !traces[1].ParseFromArray(second.data(), static_cast<int>(second.size()))) {
    return 0;
  }
  for (int w = 0; w < 2; ++w) {
    if (!CheckStepTrace(traces[w], 10, programs[w]).ok()) return 0;
  }
  absl::StatusOr<SimulationResult> timeline =
      MeasuredTimeline({&programs[0], &programs[1]}, {&traces[0], &traces[1]});
  if (!timeline.ok()) __builtin_trap();  // checked traces always draw
  (void)TimelineSvg(*timeline, {"w-1", "w-2"});
  (void)ChromeTraceJson(*timeline, {"w-1", "w-2"});
  return 0;
}
