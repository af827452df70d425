// Every documented JobSpec bound (job_spec.h kMax...) as a test case: a
// small valid spec with one field set at its limit, and the same one past
// it, with the start of the rejection message. Shared by job_spec_test and
// the multi-process bounds test, so both check the same table.
#ifndef PIPETRAIN_SPEC_SPEC_BOUNDS_TESTING_H_
#define PIPETRAIN_SPEC_SPEC_BOUNDS_TESTING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "proto/pipetrain/v1/job.pb.h"

namespace pipetrain {

struct SpecBound {
  std::string field;
  // Sets the field (and whatever else keeps the spec valid) to `value`.
  std::function<void(v1::JobSpec&, int64_t value)> set;
  int64_t limit;
  std::string beyond_message;  // the start of the INVALID_ARGUMENT message
  v1::JobSpec At() const;      // BoundsBaseSpec() with the field at `limit`
  v1::JobSpec Beyond() const;  // ... at `limit` + 1
};

// 2 layers, 2 heads, d_model 16, seq_len 8, batch 4, 10 steps, 2 stages.
v1::JobSpec BoundsBaseSpec();

std::vector<SpecBound> SpecBounds();

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_SPEC_BOUNDS_TESTING_H_
