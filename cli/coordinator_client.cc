#include "cli/coordinator_client.h"

#include <cstdlib>

#include "common/grpc_credentials.h"
#include "common/secrets.h"
#include "common/tls_credentials.h"

namespace pipetrain {

std::unique_ptr<v1::Coordinator::Stub> ConnectCoordinator(const std::string& address,
                                                          const std::string& tls_ca,
                                                          const std::string& user_token) {
  // A CA that cannot be read must not fall back to plaintext: TLS with the
  // system's roots then fails to verify our coordinator.
  return ConnectCoordinator(address,
                            ClientTlsCredentials(tls_ca, "", "")
                                .value_or(grpc::SslCredentials(grpc::SslCredentialsOptions())),
                            user_token);
}

std::unique_ptr<v1::Coordinator::Stub> ConnectCoordinator(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& user_token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return v1::Coordinator::NewStub(BearerChannel(address, credentials, args, user_token));
}

absl::StatusOr<std::string> UserTokenFrom(const std::string& token_file) {
  if (!token_file.empty()) return ReadSecretFile("--token-file", token_file);
  const char* env = std::getenv("PIPETRAIN_TOKEN");
  return std::string(env != nullptr ? env : "");
}

std::unique_ptr<grpc::ClientContext> WithDeadline(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::Status ToAbsl(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace pipetrain
