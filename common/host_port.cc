#include "common/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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
  } else if (absl::StrContains(host, ':')) {
    // gRPC reads "fd00::1:7100" as a host alone, with its default port
    // (443): an IPv6 address takes brackets, as in a URL.
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " \"", address, "\": an IPv6 address goes in brackets: write [ADDRESS]:PORT"));
  }
  if (host.empty()) {  // "[]:80"
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " \"", address, "\" has an empty host (e.g. 127.0.0.1:8080, [::1]:0)"));
  }
  split.host = std::string(host);
  split.port = port;
  return split;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EndsWith(host, ".")) host.remove_suffix(1);
  if (host.empty()) return false;
  if (absl::EqualsIgnoreCase(host, "localhost") || absl::EndsWithIgnoreCase(host, ".localhost")) {
    return true;
  }
  const std::string text(host);  // inet_pton wants a NUL-terminated string
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

bool IsIpLiteral(absl::string_view host) {
  if (host.empty()) return false;
  const std::string text(host);  // inet_pton wants a NUL-terminated string
  in_addr v4;
  in6_addr v6;
  return inet_pton(AF_INET, text.c_str(), &v4) == 1 || inet_pton(AF_INET6, text.c_str(), &v6) == 1;
}

bool IsWildcardHost(absl::string_view host) {
  if (host.empty()) return false;
  const std::string text(host);  // the libc parsers want a NUL-terminated string
  in_addr v4;
  if (inet_aton(text.c_str(), &v4) != 0) return v4.s_addr == 0;
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_UNSPECIFIED(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 0 && v6.s6_addr[13] == 0 &&
         v6.s6_addr[14] == 0 && v6.s6_addr[15] == 0;
}

absl::string_view HostOfHostHeader(absl::string_view value) {
  if (absl::StartsWith(value, "[")) {
    const size_t close = value.find(']');
    if (close == absl::string_view::npos) return value;
    const absl::string_view rest = value.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return value;
    return value.substr(1, close - 1);
  }
  const size_t colon = value.find(':');
  if (colon == absl::string_view::npos) return value;
  if (value.find(':', colon + 1) != absl::string_view::npos) return value;  // bare IPv6
  return value.substr(0, colon);
}

}  // namespace pipetrain
