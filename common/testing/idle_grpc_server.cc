#include "common/testing/idle_grpc_server.h"

#include <grpcpp/security/server_credentials.h>

#include <chrono>

#include "gtest/gtest.h"

namespace pipetrain {

IdleGrpcServer::IdleGrpcServer(const std::function<void(grpc::ServerBuilder&)>& configure) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  if (configure) configure(builder);
  builder.RegisterCallbackGenericService(&service_);  // a server needs a service
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) ADD_FAILURE() << "idle gRPC server: cannot start";
}

IdleGrpcServer::~IdleGrpcServer() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace pipetrain
