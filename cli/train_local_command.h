// `pipetrain train-local`: the single-process reference trainer from the
// command line (flags, data loading, progress, JSONL log, checkpoints).
#ifndef PIPETRAIN_CLI_TRAIN_LOCAL_COMMAND_H_
#define PIPETRAIN_CLI_TRAIN_LOCAL_COMMAND_H_

#include <string>
#include <vector>

#include "common/flag_set.h"

namespace pipetrain {

// Runs the command with the words after "train-local". Returns the process
// exit code: 0 success, 2 bad flags or flag combination, 1 any other error
// (bad data file, unreadable checkpoint, ...), 130 or 143 interrupted by
// SIGINT or SIGTERM (after the current step, writing --checkpoint if one
// was requested; no final validation then).
int RunTrainLocal(const std::vector<std::string>& args);

// The flags RunTrainLocal parses, described (for shell completion).
std::vector<FlagSet::Info> TrainLocalFlagInfo();

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_TRAIN_LOCAL_COMMAND_H_
