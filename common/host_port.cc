#include "common/host_port.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::StatusOr<HostPort> SplitHostPort(absl::string_view address, absl::string_view flag) {
  const size_t colon = address.rfind(':');
  const absl::string_view digits =
      colon == absl::string_view::npos ? absl::string_view() : address.substr(colon + 1);
  bool valid = colon != absl::string_view::npos && colon > 0 && !digits.empty() &&
               digits.size() <= 5;  // 65535 has five
  int port = 0;
  for (char c : digits) {
    valid = valid && absl::ascii_isdigit(static_cast<unsigned char>(c));
    if (valid) port = port * 10 + (c - '0');
  }
  if (!valid || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " \"", address,
                                                   "\" is not host:port with a port in [0, 65535] "
                                                   "(e.g. 127.0.0.1:8080, [::1]:0)"));
  }
  HostPort split;
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) {  // "[]:80"
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " \"", address, "\" has an empty host (e.g. 127.0.0.1:8080, [::1]:0)"));
  }
  split.host = std::string(host);
  split.port = port;
  return split;
}

}  // namespace pipetrain
