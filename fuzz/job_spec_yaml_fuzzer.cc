// Job spec files as `pipetrain submit` reads them: YAML through YamlToJson
// (cli/job_spec_file.h), then JobSpecFromJson and ResolveJobSpec, as
// ReadJobSpecFile and the coordinator do.
//
// Input: the YAML text itself (JSON is YAML too).
#include <cstddef>
#include <cstdint>
#include <string>

#include "cli/job_spec_file.h"
#include "spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::string> json = YamlToJson(yaml);
  if (!json.ok()) return 0;
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(*json);
  if (!spec.ok()) return 0;
  (void)ResolveJobSpec(*spec);
  return 0;
}
