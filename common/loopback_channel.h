// gRPC channels to this machine's loopback interface never go through an
// HTTP proxy.
//
// gRPC's http_proxy mapper sends every channel whose target is not a unix
// or vsock address through $grpc_proxy, $https_proxy or $http_proxy, unless
// the host is listed in $no_grpc_proxy (or $no_proxy). Loopback is not
// excluded, and no_proxy=localhost does not match the literal 127.0.0.1
// that `pipetrain up` uses: the coordinator's and the workers' channels
// then asked the proxy to CONNECT to "127.0.0.1:PORT", which is the proxy
// host's own loopback. Calls failed UNAVAILABLE, or the user and join
// tokens went to whatever listened at that port there.
//
// Other targets keep honouring the proxy variables: deployments whose
// coordinator or workers are reachable only through a proxy rely on them.
// Thread-safe (pure functions).
#ifndef PIPETRAIN_COMMON_LOOPBACK_CHANNEL_H_
#define PIPETRAIN_COMMON_LOOPBACK_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

// Whether every address gRPC target `target` names is on this machine's
// loopback interface (IsLoopbackHost: 127.0.0.0/8, ::1, localhost):
// "host:port", "[v6]:port", a host without a port, "dns:///host:port", and
// "ipv4:" / "ipv6:" lists ("ipv4:127.0.0.1:1,127.0.0.2:2"; all of them).
// False for anything else, such as "dns://server/host:port" or "unix:path"
// (which gRPC never proxies anyway).
bool IsLoopbackTarget(absl::string_view target);

// Sets grpc.enable_http_proxy=0 on `args` when IsLoopbackTarget(target);
// leaves `args` as it is otherwise.
void SkipProxyForLoopback(absl::string_view target, grpc::ChannelArguments* args);

// grpc::CreateCustomChannel, with SkipProxyForLoopback applied to a copy of
// `args`.
std::shared_ptr<grpc::Channel> CreateCustomChannelSkippingLoopbackProxy(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& creds,
    const grpc::ChannelArguments& args);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_LOOPBACK_CHANNEL_H_
