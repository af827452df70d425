#include "cli/coordinator_client.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/grpc_credentials.h"
#include "common/secrets.h"

namespace pipetrain {

std::unique_ptr<v1::Coordinator::Stub> ConnectCoordinator(const std::string& address,
                                                          const std::string& tls_ca,
                                                          const std::string& user_token) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    std::ifstream in(tls_ca);
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = pem.str();
    credentials = grpc::SslCredentials(options);
  }
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
