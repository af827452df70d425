// Job specs as REST clients send them (POST /v1/jobs): proto3 JSON through
// JobSpecFromJson, then ResolveJobSpec on whatever parses, then the JSON
// printer the API answers with.
//
// Input: the JSON text itself.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(json);
  if (!spec.ok()) return 0;
  JobSpecToJson(*spec);
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(*spec);
  if (resolved.ok()) JobSpecToJson(resolved->spec);
  return 0;
}
