#include "common/loopback_channel.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/grpc_credentials.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr char kMethod[] = "/test.Fake/Ok";

// The value of `key` in `args`, or -1 when absent.
int IntArg(const grpc::ChannelArguments& args, const char* key) {
  const grpc_channel_args c = args.c_channel_args();
  for (size_t i = 0; i < c.num_args; ++i) {
    if (std::string(c.args[i].key) == key && c.args[i].type == GRPC_ARG_INTEGER) {
      return c.args[i].value.integer;
    }
  }
  return -1;
}

TEST(IsLoopbackTargetTest, LoopbackForms_True) {
  for (const char* target :
       {"127.0.0.1:7070", "127.8.9.10:1", "[::1]:7070", "[::1]", "::1", "localhost:7070",
        "LOCALHOST:1", "localhost", "a.localhost:1", "dns:///127.0.0.1:7070", "dns:127.0.0.1:1",
        "ipv4:127.0.0.1:7070", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv4:///127.0.0.1:1",
        "ipv6:[::1]:7070", "[::ffff:127.0.0.1]:1"}) {
    EXPECT_TRUE(IsLoopbackTarget(target)) << target;
  }
}

TEST(IsLoopbackTargetTest, OtherTargets_False) {
  for (const char* target :
       {"", ":7070", "10.0.0.1:7070", "[::2]:7070", "::2", "example.com:7070",
        "127.0.0.1.example.com:1", "localhost.example.com:1", "dns://8.8.8.8/127.0.0.1:1",
        "ipv4:127.0.0.1:1,10.0.0.1:2", "ipv4:", "ipv6:[::1", "unix:/run/c", "[::1:7070"}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
}

TEST(SkipProxyForLoopbackTest, LoopbackTarget_ProxyDisabled) {
  grpc::ChannelArguments args;
  SkipProxyForLoopback("127.0.0.1:7070", &args);
  EXPECT_EQ(IntArg(args, GRPC_ARG_ENABLE_HTTP_PROXY), 0);
}

TEST(SkipProxyForLoopbackTest, OtherTarget_ArgsUnchanged) {
  grpc::ChannelArguments args;
  SkipProxyForLoopback("coordinator.example:7070", &args);
  EXPECT_EQ(args.c_channel_args().num_args, grpc::ChannelArguments().c_channel_args().num_args);
  EXPECT_EQ(IntArg(args, GRPC_ARG_ENABLE_HTTP_PROXY), -1);
}

// Answers every call OK.
class OkService : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() {
        grpc::Slice payload(std::string("y"));
        response_ = grpc::ByteBuffer(&payload, 1);
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer response_;
    };
    return new Reactor();
  }
};

// A server on 127.0.0.1:0, and $http_proxy naming a loopback port where
// nothing listens (a socket bound there without listen() refuses every
// connection, and keeps the port from being taken meanwhile).
class LoopbackUnderProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dead_ = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(dead_, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(dead_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    socklen_t length = sizeof(address);
    ASSERT_EQ(getsockname(dead_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    const std::string proxy = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
    // gRPC reads these when a channel is created; the first set wins.
    for (const char* name : {"grpc_proxy", "https_proxy", "HTTPS_PROXY", "HTTP_PROXY",
                             "no_grpc_proxy", "no_proxy", "NO_PROXY"}) {
      unsetenv(name);
    }
    setenv("http_proxy", proxy.c_str(), 1);

    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    unsetenv("http_proxy");
    if (server_ != nullptr) server_->Shutdown();
    if (dead_ >= 0) close(dead_);
  }

  // A call that fails at once (not waiting for ready) when the channel
  // cannot connect.
  static grpc::StatusCode Call(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice payload(std::string("x"));
    grpc::ByteBuffer request(&payload, 1), response;
    const grpc::internal::RpcMethod rpc(kMethod, grpc::internal::RpcMethod::NORMAL_RPC);
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
               channel.get(), rpc, &context, request, &response)
        .error_code();
  }

  int dead_ = -1;
  OkService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(LoopbackUnderProxyTest, PlainChannel_GoesToTheProxy_Unavailable) {
  // What every channel did before: the test's proxy is really used.
  EXPECT_EQ(Call(grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(),
                                           grpc::ChannelArguments())),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(LoopbackUnderProxyTest, SkippingLoopbackProxy_ReachesServer_Ok) {
  EXPECT_EQ(Call(CreateCustomChannelSkippingLoopbackProxy(
                target_, grpc::InsecureChannelCredentials(), grpc::ChannelArguments())),
            grpc::StatusCode::OK);
}

TEST_F(LoopbackUnderProxyTest, BearerChannel_WithAndWithoutToken_ReachesServer_Ok) {
  for (const char* token : {"", "secret"}) {
    EXPECT_EQ(Call(BearerChannel(target_, grpc::InsecureChannelCredentials(),
                                 grpc::ChannelArguments(), token)),
              grpc::StatusCode::OK)
        << "token \"" << token << "\"";
  }
}

}  // namespace
}  // namespace pipetrain
