#include "common/metrics/grpc_red_metrics.h"

#include <algorithm>
#include <memory>
#include <string>

#include "common/metrics/metrics_testing.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "gtest/gtest.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain {
namespace {

using testing::SeriesValue;

constexpr char kRequests[] = "pipetrain_rpc_requests_total";
constexpr char kDuration[] = "pipetrain_rpc_duration_seconds";
constexpr char kOk[] = "/test.Fake/Ok";
constexpr char kNotFound[] = "/test.Fake/NotFound";

// Answers every method at once: NOT_FOUND for kNotFound, UNIMPLEMENTED for
// methods it does not know, OK otherwise.
class FakeService : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(grpc::Status status) {
        if (!status.ok()) {
          Finish(status);
          return;
        }
        grpc::Slice payload(std::string("y"));
        response_ = grpc::ByteBuffer(&payload, 1);
        StartWriteAndFinish(&response_, grpc::WriteOptions(), status);
      }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer response_;
    };
    const std::string& method = context->method();
    if (method == kNotFound) return new Reactor(grpc::Status(grpc::StatusCode::NOT_FOUND, "no"));
    if (method == kOk) return new Reactor(grpc::Status::OK);
    return new Reactor(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unknown method"));
  }
};

class GrpcRedMetricsTest : public ::testing::Test {
 protected:
  GrpcRedMetricsTest() : red_(registry_, {kOk, kNotFound}) {}

  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service_);
    builder.experimental().SetInterceptorCreators(red_.Interceptors());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  grpc::StatusCode Call(const std::string& method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice payload(std::string("x"));
    grpc::ByteBuffer request(&payload, 1), response;
    const grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
    const grpc::Status status =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            channel_.get(), rpc, &context, request, &response);
    return status.error_code();
  }

  prometheus::Registry registry_;
  GrpcRedMetrics red_;
  FakeService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcRedMetricsTest, Construct_KnownMethods_OkSeriesAtZero) {
  for (const char* method : {kOk, kNotFound}) {
    EXPECT_EQ(SeriesValue(registry_, kRequests, {{"method", method}, {"code", "OK"}}), 0.0);
    EXPECT_EQ(SeriesValue(registry_, kDuration, {{"method", method}, {"code", "OK"}}), 0.0);
  }
  EXPECT_EQ(SeriesValue(registry_, kRequests, {{"method", "other"}, {"code", "OK"}}), std::nullopt);
}

TEST_F(GrpcRedMetricsTest, Interceptor_CallsEndingEachWay_CountedByMethodAndCode) {
  ASSERT_EQ(Call(kOk), grpc::StatusCode::OK);
  ASSERT_EQ(Call(kOk), grpc::StatusCode::OK);
  ASSERT_EQ(Call(kNotFound), grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(Call("/test.Fake/Unheard" /* not a label */), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(SeriesValue(registry_, kRequests, {{"method", kOk}, {"code", "OK"}}), 2.0);
  EXPECT_EQ(SeriesValue(registry_, kDuration, {{"method", kOk}, {"code", "OK"}}), 2.0);
  EXPECT_EQ(SeriesValue(registry_, kRequests, {{"method", kNotFound}, {"code", "NOT_FOUND"}}), 1.0);
  EXPECT_EQ(SeriesValue(registry_, kDuration, {{"method", kNotFound}, {"code", "NOT_FOUND"}}), 1.0);
  EXPECT_EQ(SeriesValue(registry_, kRequests, {{"method", kNotFound}, {"code", "OK"}}), 0.0);
  EXPECT_EQ(SeriesValue(registry_, kRequests, {{"method", "other"}, {"code", "UNIMPLEMENTED"}}),
            1.0);
}

TEST(GrpcRedMetrics, MethodsOf_CoordinatorService_FullNamesOfEveryMethod) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::CoordinatorService::service_full_name());
  ASSERT_NE(service, nullptr);
  const std::vector<std::string> methods = GrpcRedMetrics::MethodsOf({service});
  EXPECT_EQ(methods.size(), static_cast<size_t>(service->method_count()));
  EXPECT_NE(std::find(methods.begin(), methods.end(), "/pipetrain.v1.CoordinatorService/SubmitJob"),
            methods.end());
  EXPECT_NE(std::find(methods.begin(), methods.end(),
                      "/pipetrain.v1.CoordinatorService/WatchAssignments"),
            methods.end());
}

TEST(GrpcRedMetrics, CodeName_EveryCode_GoogleRpcNames) {
  EXPECT_EQ(GrpcRedMetrics::CodeName(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(GrpcRedMetrics::CodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_EQ(GrpcRedMetrics::CodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  EXPECT_EQ(GrpcRedMetrics::CodeName(static_cast<grpc::StatusCode>(99)), "UNKNOWN");
}

}  // namespace
}  // namespace pipetrain
