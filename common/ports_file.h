// Ports files: how a process started on port 0 tells its parent (pipetrain
// up, the multi-process tests) which ports the kernel gave it. A small JSON
// object such as {"grpc_port": 40123, "http_port": 40124}.
#ifndef PIPETRAIN_COMMON_PORTS_FILE_H_
#define PIPETRAIN_COMMON_PORTS_FILE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain {

// Writes {"name": port, ...} to a temporary file and renames it over `path`,
// so a reader never sees half a file. PERMISSION_DENIED naming the file.
absl::Status WritePortsFile(const std::string& path,
                            const std::vector<std::pair<std::string, int>>& ports);

// The integer `field` of the ports file at `path`; INTERNAL naming both.
absl::StatusOr<int> ReadPort(const std::string& path, const std::string& field);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_PORTS_FILE_H_
