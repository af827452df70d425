// Byte counts written as flags take them ("512M", "8G", "1.5T"): shared by
// the worker's memory flags and the coordinator's --gpu-memory-reserve, so
// both read a size alike.
#ifndef PIPETRAIN_COMMON_BYTE_SIZE_H_
#define PIPETRAIN_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

// Parses a byte count with an optional binary suffix (K, M, G, T, in any
// case): "512M", "8G", "1.5T", "1048576". INVALID_ARGUMENT (naming `flag`)
// for anything else, zero or negative values, or more than 1 PiB.
absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_BYTE_SIZE_H_
