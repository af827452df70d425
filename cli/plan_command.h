// `pipetrain plan`: solve how to split a profiled model over a cluster and
// show the plan, its predicted iteration time and timeline (the Planner
// issue, scope 5). Exit codes: 0 ok, 2 bad flags, 1 bad input files or no
// feasible plan (the message says which).
#ifndef PIPETRAIN_CLI_PLAN_COMMAND_H_
#define PIPETRAIN_CLI_PLAN_COMMAND_H_

#include <string>
#include <vector>

#include "common/flag_set.h"

namespace pipetrain {

int RunPlan(const std::vector<std::string>& args);

// The flags RunPlan parses, described (for shell completion).
std::vector<FlagSet::Info> PlanFlagInfo();

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_PLAN_COMMAND_H_
