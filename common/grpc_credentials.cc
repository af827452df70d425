#include "common/grpc_credentials.h"

#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/loopback_channel.h"

namespace pipetrain {

std::string AuthorizationOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  if (metadata.count(kAuthorizationKey) != 1) return "";
  const grpc::string_ref value = metadata.find(kAuthorizationKey)->second;
  return std::string(value.data(), value.size());
}

void AddBearer(grpc::ClientContext& context, absl::string_view token) {
  if (token.empty()) return;
  context.AddMetadata(kAuthorizationKey, absl::StrCat("Bearer ", token));
}

namespace {

class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationKey, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;  // owned by the factory, which the channel keeps
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

std::shared_ptr<grpc::Channel> BearerChannel(const std::string& target,
                                             const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                             const grpc::ChannelArguments& args,
                                             std::string token) {
  // A proxy would carry a loopback coordinator's token to another host.
  grpc::ChannelArguments own = args;
  SkipProxyForLoopback(target, &own);
  if (token.empty()) return grpc::CreateCustomChannel(target, creds, own);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerInterceptorFactory>(std::move(token)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, own,
                                                                 std::move(factories));
}

}  // namespace pipetrain
