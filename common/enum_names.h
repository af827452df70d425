// Proto enum values by their short name: the value's name without the
// prefix buf's ENUM_VALUE_PREFIX rule gives it (v1::JOB_STATE_RUNNING ->
// "RUNNING", v1::Assignment::ACTION_RUN -> "RUN"). For what people read and
// what labels carry: logs, error messages, CLI tables, program text, metric
// labels. Proto JSON (REST, the CLI's --json) keeps the full names, and so
// does the unset value (TENSOR_KIND_UNSPECIFIED).
//
//   EnumShortName(v1::TENSOR_KIND_ACTIVATION)  // "ACTIVATION"
//
// Thread-safe (descriptors are immutable).
#ifndef PIPETRAIN_COMMON_ENUM_NAMES_H_
#define PIPETRAIN_COMMON_ENUM_NAMES_H_

#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace pipetrain {

// The enum's name in upper snake case plus "_" ("TensorKind" ->
// "TENSOR_KIND_"): the prefix its values carry.
std::string EnumValuePrefix(const google::protobuf::EnumDescriptor& type);

// The name of value `number` of `type` without EnumValuePrefix(type). The
// whole name when it does not start with it, and for the zero value
// <PREFIX>UNSPECIFIED ("UNSPECIFIED" alone would not say what is missing);
// the decimal number when `type` has no such value (a newer peer's value).
std::string EnumShortName(const google::protobuf::EnumDescriptor& type, int number);

// The same for a generated enum type, e.g. EnumShortName(job.state()).
template <typename E>
std::string EnumShortName(E value) {
  return EnumShortName(*google::protobuf::GetEnumDescriptor<E>(), static_cast<int>(value));
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ENUM_NAMES_H_
