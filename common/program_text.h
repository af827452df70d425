// Human-readable text for program instructions, e.g.
// "recv ACTIVATION unit 3 mb 1 from stage 0": used by worker status,
// heartbeats, error messages and tests.
#ifndef PIPETRAIN_COMMON_PROGRAM_TEXT_H_
#define PIPETRAIN_COMMON_PROGRAM_TEXT_H_

#include <string>

#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

std::string DescribeInstruction(const v1::Instruction& instruction);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PROGRAM_TEXT_H_
