#include "cli/interrupt.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/testing/idle_grpc_server.h"
#include "common/testing/silenceable_relay.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A call to a coordinator that answers nothing (its host gone with the
// connection open: a silent relay) is cancelled by Ctrl-C at once, not
// after its deadline: `submit --follow` swallowed each Ctrl-C for up to
// --timeout. A call begun after the signal is cancelled at its start.
TEST(InterruptTest, CtrlC_CancelsACallWaitingOnASilentPeer) {
  IdleGrpcServer server;
  SilenceableRelay relay(server.port());
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(relay.endpoint(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
  relay.Freeze();
  CatchInterrupt(SIGINT);
  ASSERT_FALSE(Interrupted());
  grpc::GenericStub stub(channel);
  // Set once the first call is under way, its CancelOnInterrupt alive.
  absl::Notification started;
  // The call, unanswered, holds its deadline (60 s) unless cancelled.
  const auto call = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    const CancelOnInterrupt cancel(&context);
    const grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&context, "/pipetrain.test.Nothing/Call", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    if (!started.HasBeenNotified()) started.Notify();
    done.WaitForNotification();
    return status;
  };
  const absl::Time start = absl::Now();
  std::thread ctrl_c([&relay, &started] {
    // Once the call is under way (the relay's count alone may be the
    // connection's last handshake bytes, dropped before any call: the
    // signal then came first and the call was cancelled at its start,
    // the path the last call below tests) and has reached the silent
    // peer: in flight.
    started.WaitForNotification();
    EXPECT_TRUE(relay.AwaitDroppedBytes(1, absl::Seconds(30)));
    raise(SIGINT);
  });
  const grpc::Status cancelled = call();
  ctrl_c.join();
  EXPECT_EQ(cancelled.error_code(), grpc::StatusCode::CANCELLED) << cancelled.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(Interrupted());
  EXPECT_EQ(InterruptSignal(), SIGINT);
  EXPECT_EQ(call().error_code(), grpc::StatusCode::CANCELLED);  // after the signal
}

}  // namespace
}  // namespace pipetrain
