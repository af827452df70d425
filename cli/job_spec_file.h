// Job spec files for `pipetrain submit`: JSON (proto3 canonical JSON of
// pipetrain.v1.JobSpec) or YAML with the same structure and field names.
#ifndef PIPETRAIN_CLI_JOB_SPEC_FILE_H_
#define PIPETRAIN_CLI_JOB_SPEC_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/pipetrain/v1/job.pb.h"

namespace pipetrain {

// YAML text -> the equivalent JSON text. Plain scalars that read as
// integers, floats, true/false or null become those JSON types; quoted
// scalars stay strings. INVALID_ARGUMENT with the parser's line and column,
// for text that is not UTF-8, and past the limits a job spec never nears:
// more than 100000 nodes once aliases are expanded, or nesting more than 64
// levels deep (which an alias inside its own anchor, "&a [*a]", does).
absl::StatusOr<std::string> YamlToJson(const std::string& yaml);

// Reads `path` (".json" as JSON; ".yaml"/".yml" or anything else as YAML,
// which is a superset of JSON) and parses it as a JobSpec. NOT_FOUND for a
// missing file; INVALID_ARGUMENT for a path that is not a regular file, a
// file over kMaxJobSpecFileBytes, YAML that does not parse, a key given
// twice in one mapping or object, YAML's or JSON's (the message starts
// with the path) and, naming the field, unknown fields and wrong types. Defaults are not filled in here (the coordinator does it).
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);

// The largest spec file read: the coordinator takes no request larger
// (4 MiB), and a spec is a few hundred bytes.
inline constexpr int64_t kMaxJobSpecFileBytes = int64_t{4} << 20;

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_JOB_SPEC_FILE_H_
