#include "coordinator/jobs/worker_profile_fetcher.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_credentials.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"

namespace pipetrain {

ProfileFetcher MakeWorkerProfileFetcher(absl::Duration timeout) {
  return [timeout](const std::string& address, const std::string& session_token,
                   const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
    auto stub = v1::WorkerControlService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration wait = absl::Milliseconds(50);
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      AddBearer(context, session_token);
      v1::ModelProfile profile;
      grpc::Status s = stub->Profile(&context, request, &profile);
      if (s.ok()) return profile;
      // The worker may not have read its session yet (see the header).
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && attempt < kProfileSessionRetries &&
          absl::Now() + wait < deadline) {
        absl::SleepFor(wait);
        wait *= 2;
        continue;
      }
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("profile from ", address, ": ", s.error_message()));
    }
  };
}

}  // namespace pipetrain
