#include "common/ports_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/temp_file.h"
#include "nlohmann/json.hpp"

namespace pipetrain {

absl::Status WritePortsFile(const std::string& path,
                            const std::vector<std::pair<std::string, int>>& ports) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [name, port] : ports) json[name] = port;
  // A fresh temporary created exclusively: "<path>.tmp" could be a file or
  // link another user planted in a shared directory, written through.
  const std::string temporary = TempPathFor(path);
  if (absl::Status written = WriteNewFile(temporary, json.dump() + "\n", 0666); !written.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("ports file: ", written.message()));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::PermissionDeniedError(
        absl::StrCat("cannot rename ports file ", temporary, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ReadPort(const std::string& path, const std::string& field) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.contains(field) || !json[field].is_number_integer()) {
    return absl::InternalError(absl::StrCat(path, ": no integer '", field, "'"));
  }
  // A port, not what a wrapped int64 would make of one.
  const int64_t port = json[field].get<int64_t>();
  if (port < 0 || port > 65535) {
    return absl::InternalError(absl::StrCat(path, ": '", field, "' is ", port, ", not a port"));
  }
  return static_cast<int>(port);
}

}  // namespace pipetrain
