#include "tests/grpc_probe.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_wire.h"

namespace pipetrain::testing {
namespace {

// Field numbers of the published messages.
// grpc.health.v1: HealthCheckRequest.service = 1; HealthCheckResponse.status = 1.
constexpr int kHealthService = 1, kHealthStatus = 1;
// grpc.reflection.v1alpha: ServerReflectionRequest.list_services = 7;
// ServerReflectionResponse.list_services_response = 6, .error_response = 7;
// ListServiceResponse.service = 1; ServiceResponse.name = 1;
// ErrorResponse.error_code = 1, .error_message = 2.
constexpr int kListServices = 7, kListServicesResponse = 6, kErrorResponse = 7;
constexpr int kServiceEntry = 1, kServiceName = 1, kErrorMessage = 2;

absl::Status ToAbsl(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace

// One call over a completion queue of its own, one operation at a time, so
// the next event is always the one awaited.
class RawGrpcCall {
 public:
  RawGrpcCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
              absl::Duration timeout)
      : stub_(channel) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    call_ = stub_.PrepareCall(&context_, method, &queue_);
  }
  ~RawGrpcCall() {
    context_.TryCancel();
    if (started_ && !finished_) Finish().IgnoreError();  // cancelled: its status says so
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }

  bool Start() {
    call_->StartCall(this);
    return started_ = Await();
  }
  bool Write(const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call_->Write(buffer, this);
    return Await();
  }
  bool WritesDone() {
    call_->WritesDone(this);
    return Await();
  }
  // False at the end of the stream.
  bool Read(std::string& bytes) {
    grpc::ByteBuffer buffer;
    call_->Read(&buffer, this);
    if (!Await()) return false;
    std::vector<grpc::Slice> slices;
    bytes.clear();
    if (!buffer.Dump(&slices).ok()) return false;
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return true;
  }
  absl::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, this);
    Await();
    finished_ = true;
    return ToAbsl(status);
  }

 private:
  // The operation's success. Every operation is bounded by the deadline.
  bool Await() {
    void* tag = nullptr;
    bool ok = false;
    return queue_.Next(&tag, &ok) && ok;
  }

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool started_ = false;
  bool finished_ = false;
};

std::string ServingStatusName(uint64_t status) {
  switch (status) {
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

namespace {

// Sends `request` on `call` (started, writes then closed) and reads one
// response; the call's status when there is none.
absl::StatusOr<std::string> OneExchange(RawGrpcCall& call, const std::string& request) {
  std::string response;
  if (!call.Start() || !call.Write(request) || !call.WritesDone() || !call.Read(response)) {
    absl::Status status = call.Finish();
    return status.ok() ? absl::UnknownError("the server sent no response") : status;
  }
  return response;
}

absl::StatusOr<std::string> StatusIn(const std::string& response) {
  absl::StatusOr<WireFields> fields = ParseWireFields(response);
  if (!fields.ok()) return fields.status();
  return ServingStatusName(fields->Varint(kHealthStatus));
}

}  // namespace

absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& service, absl::Duration timeout) {
  RawGrpcCall call(channel, "/grpc.health.v1.Health/Check", timeout);
  absl::StatusOr<std::string> response = OneExchange(call, WireString(kHealthService, service));
  if (!response.ok()) return response.status();
  absl::Status finished = call.Finish();
  if (!finished.ok()) return finished;
  return StatusIn(*response);
}

absl::StatusOr<std::vector<std::string>> ListServices(const std::shared_ptr<grpc::Channel>& channel,
                                                      absl::Duration timeout) {
  RawGrpcCall call(channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                   timeout);
  absl::StatusOr<std::string> response = OneExchange(call, WireString(kListServices, "*"));
  if (!response.ok()) return response.status();
  absl::StatusOr<WireFields> fields = ParseWireFields(*response);
  if (!fields.ok()) return fields.status();
  if (fields->strings.count(kErrorResponse) > 0) {
    absl::StatusOr<WireFields> error = ParseWireFields(fields->String(kErrorResponse));
    return absl::UnknownError(
        absl::StrCat("reflection error: ", error.ok() ? error->String(kErrorMessage) : "?"));
  }
  absl::StatusOr<WireFields> list = ParseWireFields(fields->String(kListServicesResponse));
  if (!list.ok()) return list.status();
  std::vector<std::string> names;
  for (const std::string& entry : list->Strings(kServiceEntry)) {
    absl::StatusOr<WireFields> service = ParseWireFields(entry);
    if (!service.ok()) return service.status();
    names.push_back(service->String(kServiceName));
  }
  return names;
}

HealthWatch::HealthWatch(std::unique_ptr<RawGrpcCall> call) : call_(std::move(call)) {}
HealthWatch::~HealthWatch() = default;

absl::StatusOr<std::unique_ptr<HealthWatch>> HealthWatch::Open(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    absl::Duration timeout) {
  auto call = std::make_unique<RawGrpcCall>(channel, "/grpc.health.v1.Health/Watch", timeout);
  if (!call->Start() || !call->Write(WireString(kHealthService, service)) || !call->WritesDone()) {
    absl::Status status = call->Finish();
    return status.ok() ? absl::UnknownError("the watch ended at once") : status;
  }
  return std::unique_ptr<HealthWatch>(new HealthWatch(std::move(call)));
}

absl::StatusOr<std::string> HealthWatch::Next() {
  std::string response;
  if (!call_->Read(response)) {
    absl::Status status = call_->Finish();
    return status.ok() ? absl::OutOfRangeError("the watch ended") : status;
  }
  return StatusIn(response);
}

}  // namespace pipetrain::testing
