#include "common/enum_names.h"

#include <cctype>

namespace pipetrain {

std::string EnumValuePrefix(const google::protobuf::EnumDescriptor& type) {
  const std::string& name = type.name();
  std::string prefix;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool boundary = i > 0 && std::isupper(c) &&
                          (std::islower(static_cast<unsigned char>(name[i - 1])) ||
                           std::isdigit(static_cast<unsigned char>(name[i - 1])));
    if (boundary) prefix += '_';
    prefix += static_cast<char>(std::toupper(c));
  }
  return prefix + "_";
}

std::string EnumShortName(const google::protobuf::EnumDescriptor& type, int number) {
  const google::protobuf::EnumValueDescriptor* value = type.FindValueByNumber(number);
  if (value == nullptr) return std::to_string(number);
  const std::string& name = value->name();
  const std::string prefix = EnumValuePrefix(type);
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return name;
  std::string short_name = name.substr(prefix.size());
  return short_name == "UNSPECIFIED" ? name : short_name;
}

}  // namespace pipetrain
