// IdleGrpcServer: a gRPC server on an ephemeral port of 127.0.0.1 whose
// only service is a generic one no test calls, for tests of channels and
// connections (keepalives, cancels) rather than of a service.
#ifndef PIPETRAIN_COMMON_TESTING_IDLE_GRPC_SERVER_H_
#define PIPETRAIN_COMMON_TESTING_IDLE_GRPC_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <functional>
#include <memory>

namespace pipetrain {

class IdleGrpcServer {
 public:
  // `configure` may set the builder's options (limits, channel arguments)
  // before the server starts. A test failure if it does not start.
  explicit IdleGrpcServer(const std::function<void(grpc::ServerBuilder&)>& configure = nullptr);
  ~IdleGrpcServer();  // shuts down at once
  IdleGrpcServer(const IdleGrpcServer&) = delete;
  IdleGrpcServer& operator=(const IdleGrpcServer&) = delete;

  int port() const { return port_; }

 private:
  grpc::CallbackGenericService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_IDLE_GRPC_SERVER_H_
