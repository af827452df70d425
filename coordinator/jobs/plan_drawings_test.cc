#include "coordinator/jobs/plan_drawings.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A plan of one stage with a megabyte in each drawing.
v1::Plan PlanWithDrawings() {
  v1::Plan plan;
  plan.set_timeline_svg(std::string(1 << 20, 's'));
  plan.set_chrome_trace_json(std::string(1 << 20, 'c'));
  plan.set_measured_timeline_svg(std::string(1 << 20, 'm'));
  plan.set_measured_chrome_trace_json(std::string(1 << 20, 't'));
  plan.add_stages();
  return plan;
}

TEST(PlanDrawingsTest, Dropped_EmptyAndTheirMemoryFreed) {
  v1::Plan plan = PlanWithDrawings();
  DropPlanDrawings(plan);
  // An empty string's inline capacity: no heap buffer behind the field.
  const size_t inline_capacity = std::string().capacity();
  for (const std::string* drawing :
       {&plan.timeline_svg(), &plan.chrome_trace_json(), &plan.measured_timeline_svg(),
        &plan.measured_chrome_trace_json()}) {
    EXPECT_TRUE(drawing->empty());
    EXPECT_LE(drawing->capacity(), inline_capacity);
  }
  EXPECT_EQ(plan.stages_size(), 1);  // the plan itself is kept
}

// The copy lacks the drawings; the plan keeps them, in the same buffers
// (set aside and put back, never copied).
TEST(PlanDrawingsTest, CopyWithoutDrawings_PlanKeepsThem) {
  v1::Plan plan = PlanWithDrawings();
  const char* const buffer = plan.timeline_svg().data();
  const v1::Plan copy = PlanCopyWithoutDrawings(plan);
  EXPECT_TRUE(copy.timeline_svg().empty());
  EXPECT_TRUE(copy.chrome_trace_json().empty());
  EXPECT_TRUE(copy.measured_timeline_svg().empty());
  EXPECT_TRUE(copy.measured_chrome_trace_json().empty());
  EXPECT_EQ(copy.stages_size(), 1);
  EXPECT_EQ(plan.timeline_svg(), std::string(1 << 20, 's'));
  EXPECT_EQ(plan.timeline_svg().data(), buffer);
  EXPECT_EQ(plan.chrome_trace_json(), std::string(1 << 20, 'c'));
  EXPECT_EQ(plan.measured_timeline_svg(), std::string(1 << 20, 'm'));
  EXPECT_EQ(plan.measured_chrome_trace_json(), std::string(1 << 20, 't'));
}

}  // namespace
}  // namespace pipetrain
