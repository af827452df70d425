#include "common/host_port.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(SplitHostPortTest, HostsAndPortsInRange) {
  struct Case {
    const char* address;
    const char* host;
    int port;
  } cases[] = {{"127.0.0.1:0", "127.0.0.1", 0},
               {"0.0.0.0:65535", "0.0.0.0", 65535},
               {"[::1]:8080", "::1", 8080},
               {"[::]:0", "::", 0},
               {"localhost:00080", "localhost", 80}};
  for (const Case& c : cases) {
    absl::StatusOr<HostPort> split = SplitHostPort(c.address, "--listen");
    ASSERT_TRUE(split.ok()) << c.address << ": " << split.status();
    EXPECT_EQ(split->host, c.host) << c.address;
    EXPECT_EQ(split->port, c.port) << c.address;
  }
}

// Ports that gRPC and the HTTP library would have cut to 16 bits (70000 ->
// 4464), and addresses that are not host:port at all.
TEST(SplitHostPortTest, OutOfRangeOrMalformed_InvalidArgumentNamingTheFlag) {
  for (const char* address :
       {"127.0.0.1:65536", "127.0.0.1:70000", "127.0.0.1:99999", "127.0.0.1:4294967296",
        "127.0.0.1:-1", "127.0.0.1:+80", "127.0.0.1: 80", "127.0.0.1:80 ",
        "127.0.0.1:", "127.0.0.1", ":8080", "", "[::1]:0x50", "host:123456"}) {
    absl::StatusOr<HostPort> split = SplitHostPort(address, "--metrics-address");
    ASSERT_FALSE(split.ok()) << address;
    EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_EQ(split.status().message(),
              std::string("--metrics-address \"") + address +
                  "\" is not host:port with a port in [0, 65535] (e.g. 127.0.0.1:8080, [::1]:0)");
  }
}

// gRPC reads an IPv6 address without brackets as the host alone (with
// port 443): refused, saying how to write it.
TEST(SplitHostPortTest, Ipv6WithoutBrackets_InvalidArgument) {
  for (const char* address : {"fd00::1:7100", "::1:80", "::1"}) {
    absl::StatusOr<HostPort> split = SplitHostPort(address, "--listen");
    ASSERT_FALSE(split.ok()) << address;
    EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument) << address;
  }
  EXPECT_EQ(SplitHostPort("fd00::1:7100", "--listen").status().message(),
            "--listen \"fd00::1:7100\": an IPv6 address goes in brackets: write [ADDRESS]:PORT");
  EXPECT_TRUE(SplitHostPort("[fd00::1]:7100", "--listen").ok());
}

TEST(SplitHostPortTest, EmptyBracketedHost_InvalidArgument) {
  absl::StatusOr<HostPort> split = SplitHostPort("[]:80", "--listen");
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().message(),
            "--listen \"[]:80\" has an empty host (e.g. 127.0.0.1:8080, [::1]:0)");
}

// The HA coordinator rebinds its --grpc-address host on the port it held
// as a follower: a wildcard stays a wildcard, IPv6 in brackets.
TEST(JoinHostPortTest, InverseOfSplit) {
  for (const char* address :
       {"0.0.0.0:7070", "[::]:7070", "[::1]:0", "10.1.2.3:65535", "coordinator.example:80"}) {
    absl::StatusOr<HostPort> split = SplitHostPort(address, "--listen");
    ASSERT_TRUE(split.ok()) << address;
    EXPECT_EQ(JoinHostPort(split->host, split->port), address);
  }
  EXPECT_EQ(JoinHostPort("::", 7071), "[::]:7071");
}

// Names a DNS answer could point anywhere are not loopback, however they
// look: only literal loopback addresses and the names browsers resolve to
// loopback themselves count.
TEST(IsLoopbackHostTest, LiteralLoopbackAndLocalhostOnly) {
  for (const char* host :
       {"localhost", "LOCALHOST", "localhost.", "app.localhost", "127.0.0.1", "127.255.3.4",
        "127.0.1.1", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host :
       {"", ".", "localhost.evil.example", "evil.example", "127.0.0.1.evil.example", "128.0.0.1",
        "10.0.0.1", "0.0.0.0", "::", "::2", "::ffff:10.0.0.1", "evil-localhost"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(IsWildcardHostTest, EverySpellingOfTheAnyAddress) {
  for (const char* host :
       {"0.0.0.0", "0", "0.0.0", "::", "::0", "0:0:0:0:0:0:0:0", "0::0", "::ffff:0.0.0.0"}) {
    EXPECT_TRUE(IsWildcardHost(host)) << host;
  }
  for (const char* host : {"", "127.0.0.1", "10.0.0.5", "::1", "::ffff:10.0.0.1", "localhost",
                           "worker-0", "0.0.0.1"}) {
    EXPECT_FALSE(IsWildcardHost(host)) << host;
  }
}

TEST(IsIpLiteralTest, AddressesNotNames) {
  EXPECT_TRUE(IsIpLiteral("10.1.2.3"));
  EXPECT_TRUE(IsIpLiteral("::1"));
  EXPECT_TRUE(IsIpLiteral("fe80::1"));
  EXPECT_TRUE(IsIpLiteral("::ffff:10.0.0.1"));
  EXPECT_FALSE(IsIpLiteral("evil.example"));
  EXPECT_FALSE(IsIpLiteral("10.1.2.3.nip.io"));
  EXPECT_FALSE(IsIpLiteral("[::1]"));
  EXPECT_FALSE(IsIpLiteral(""));
}

TEST(HostOfHostHeaderTest, PortAndBracketsRemoved) {
  EXPECT_EQ(HostOfHostHeader("127.0.0.1:8080"), "127.0.0.1");
  EXPECT_EQ(HostOfHostHeader("localhost"), "localhost");
  EXPECT_EQ(HostOfHostHeader("[::1]:80"), "::1");
  EXPECT_EQ(HostOfHostHeader("[::1]"), "::1");
  EXPECT_EQ(HostOfHostHeader("::1"), "::1");
  // Malformed: kept whole, so never taken for loopback by a prefix.
  EXPECT_EQ(HostOfHostHeader("[::1]evil.example"), "[::1]evil.example");
  EXPECT_EQ(HostOfHostHeader("[::1"), "[::1");
  EXPECT_FALSE(IsLoopbackHost(HostOfHostHeader("[::1]evil.example")));
}

}  // namespace
}  // namespace pipetrain
