// Listen addresses given on command lines: "host:port" or "[v6]:port".
//
// gRPC and the HTTP library both take a port as an int and keep its low 16
// bits, so "127.0.0.1:70000" bound port 4464 and a worker advertised a
// metrics port nothing served. Every listen flag is parsed here first.
#ifndef PIPETRAIN_COMMON_HOST_PORT_H_
#define PIPETRAIN_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

struct HostPort {
  std::string host;  // without an IPv6 address's brackets
  int port = 0;      // 0: any free port
};

// Splits `address` at its last ':'. The host must not be empty; the port
// is decimal digits only, in [0, 65535]. INVALID_ARGUMENT otherwise:
// "<flag> \"<address>\" is not host:port with a port in [0, 65535]
// (e.g. 127.0.0.1:8080, [::1]:0)", with `flag` naming where it came from.
absl::StatusOr<HostPort> SplitHostPort(absl::string_view address, absl::string_view flag);

// "host:port", with an IPv6 host (one holding ':') in brackets: the
// inverse of SplitHostPort ("::" and 7070 give "[::]:7070").
std::string JoinHostPort(absl::string_view host, int port);

// Whether `host` (no brackets, no port) can only name this machine's
// loopback interface: "localhost" or a name under ".localhost" (RFC 6761;
// browsers resolve those themselves, never by DNS), an IPv4 address in
// 127.0.0.0/8, "::1", or an IPv4-mapped 127.x address. Case-insensitive; a
// trailing dot is allowed. Any other name may resolve elsewhere.
bool IsLoopbackHost(absl::string_view host);

// Whether `host` (no brackets, no port) is an IPv4 address in dotted-quad
// form or an IPv6 address (inet_pton's forms): no name, so nothing a DNS
// answer can point elsewhere (DNS rebinding needs a name).
bool IsIpLiteral(absl::string_view host);

// Whether `host` (no brackets, no port) is an address that binds every
// interface: IPv4's 0.0.0.0 in any form inet_aton reads ("0", "0.0.0"), or
// IPv6's unspecified address in any spelling ("::", "::0", "0:0::0") or
// IPv4-mapped ("::ffff:0.0.0.0"). Such an address cannot be advertised.
bool IsWildcardHost(absl::string_view host);

// The host of an HTTP Host header value ("name", "name:port", "[v6]",
// "[v6]:port"), without brackets or port; the value itself when it is
// none of those (e.g. an unbracketed IPv6 address).
absl::string_view HostOfHostHeader(absl::string_view value);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_HOST_PORT_H_
