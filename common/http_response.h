// The response a pipetrain HTTP handler returns, and the JSON error shape
// every endpoint uses. Included by common/http_server.h; split out so the
// connection gate (common/http_gate.h) can answer with the same bodies.
#ifndef PIPETRAIN_COMMON_HTTP_RESPONSE_H_
#define PIPETRAIN_COMMON_HTTP_RESPONSE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// `status` with `body` as application/json.
HttpResponse JsonResponse(int status, std::string body);
// The error body every endpoint uses: google.rpc.Status as JSON,
// {"code": 3, "message": "...", "details": [...]} (common/rpc_status.h: a
// message "<field>: <why>" of INVALID_ARGUMENT adds a BadRequest detail).
HttpResponse JsonError(int status, const absl::Status& error);
// The same for the code named `code` ("INVALID_ARGUMENT"; UNKNOWN for a
// name that is none).
HttpResponse JsonError(int status, absl::string_view code, absl::string_view message);

// `response` as HTTP/1.1 bytes on the wire, with Content-Length and
// "Connection: close" (the server closes after answering). For the answers
// the server gives before any handler runs (limits, timeouts).
std::string SerializeClosingResponse(const HttpResponse& response);

// The status of serialized response bytes ("HTTP/1.1 404 Not Found..."); 0
// when they hold none.
int HttpStatusOf(absl::string_view response);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_HTTP_RESPONSE_H_
