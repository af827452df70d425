// Validation messages in the words of the command line. The checks of a
// JobSpec (spec/job_spec.h) and of a TrainConfig (worker/train) name the
// fields they check, "spec.training.batch_size" or "batch_size"; a user of
// `pipetrain up` or `train-local` set them with flags ("--batch") and
// should read those.
#ifndef PIPETRAIN_CLI_FLAG_NAMES_H_
#define PIPETRAIN_CLI_FLAG_NAMES_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pipetrain {

// (field name, the flag that sets it), e.g. {"spec.training.batch_size",
// "--batch"}.
using FlagNames = absl::Span<const std::pair<absl::string_view, absl::string_view>>;

// `message` with every word equal to a field of `flags` replaced by its
// flag. A word is a maximal run of letters, digits, '_' and '.' (so
// "spec.training.lr" is not a part of "spec.training.lr_schedule"), less a
// trailing '.' (a sentence's end). Other words are kept as they are.
std::string NameFlags(absl::string_view message, FlagNames flags);

// `status` with its message rewritten so; OK stays OK.
absl::Status NameFlags(const absl::Status& status, FlagNames flags);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_FLAG_NAMES_H_
