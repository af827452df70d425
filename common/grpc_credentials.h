// Bearer credentials on gRPC calls: the "authorization" metadata pipetrain
// uses for user tokens and worker session credentials (docs/operations.md
// "Security"). Thread-safe (pure functions).
#ifndef PIPETRAIN_COMMON_GRPC_CREDENTIALS_H_
#define PIPETRAIN_COMMON_GRPC_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

// The metadata key (gRPC keys are lowercase).
inline constexpr char kAuthorizationKey[] = "authorization";

// The call's "authorization" value, "" when absent. When a client sent it
// more than once, "" (ambiguous credentials are no credentials).
std::string AuthorizationOf(const grpc::ServerContextBase& context);

// Adds "authorization: Bearer <token>" to a client call; nothing when
// `token` is empty.
void AddBearer(grpc::ClientContext& context, absl::string_view token);

// A channel whose every call carries "authorization: Bearer <token>" (none
// when `token` is empty). An interceptor rather than call credentials,
// because gRPC refuses call credentials on plaintext channels, and a
// loopback coordinator without TLS still wants its user token. A loopback
// `target` is never reached through an HTTP proxy (loopback_channel.h).
std::shared_ptr<grpc::Channel> BearerChannel(const std::string& target,
                                             const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                             const grpc::ChannelArguments& args,
                                             std::string token);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_GRPC_CREDENTIALS_H_
