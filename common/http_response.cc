#include "common/http_response.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc_status.h"

namespace pipetrain {
namespace {

// Reason phrases for the statuses the server sends itself; clients read the
// number, so anything else gets a generic phrase.
absl::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : "Error";
  }
}

}  // namespace

HttpResponse JsonResponse(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

HttpResponse JsonError(int status, const absl::Status& error) {
  return JsonResponse(status, RpcStatusJson(error));
}

HttpResponse JsonError(int status, absl::string_view code, absl::string_view message) {
  absl::StatusCode named = absl::StatusCode::kUnknown;
  for (int i = 1; i <= 16; ++i) {
    if (absl::StatusCodeToString(static_cast<absl::StatusCode>(i)) == code) {
      named = static_cast<absl::StatusCode>(i);
    }
  }
  return JsonError(status, absl::Status(named, message));
}

std::string SerializeClosingResponse(const HttpResponse& response) {
  return absl::StrCat("HTTP/1.1 ", response.status, " ", ReasonPhrase(response.status),
                      "\r\nContent-Type: ", response.content_type,
                      "\r\nContent-Length: ", response.body.size(),
                      "\r\nConnection: close\r\n\r\n", response.body);
}

int HttpStatusOf(absl::string_view response) {
  int status = 0;
  if (!absl::StartsWith(response, "HTTP/") || response.size() < 12) return 0;
  return absl::SimpleAtoi(response.substr(9, 3), &status) ? status : 0;
}

}  // namespace pipetrain
