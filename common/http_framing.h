// Where an HTTP/1.1 request ends, found from the bytes a connection has
// received so far, with limits on its size checked before it is complete.
// No sockets: HttpGate (common/http_gate.h) reads, this decides.
//
//   HttpRequestFramer framer(limits);
//   buffer += bytes_just_read;
//   switch (framer.Update(buffer)) {
//     case HttpRequestFramer::Progress::kNeedMore: ...      // read on
//     case HttpRequestFramer::Progress::kComplete: ...      // buffer[0, framer.request_bytes())
//     case HttpRequestFramer::Progress::kRejected: ...      // answer framer.rejection()
//   }
//
// A request is its head (request line and headers, through the blank line
// "\r\n\r\n") and a body of exactly Content-Length bytes (none without the
// header). The framer reads only the framing headers; everything else is the
// HTTP parser's job once the request is complete.
//
// Rejections (status, code of the JSON error body):
//   414 RESOURCE_EXHAUSTED  request line longer than max_request_line_bytes
//                           (decided as soon as that many bytes arrived)
//   431 RESOURCE_EXHAUSTED  head longer than max_header_bytes, or a Range
//                           header over 256 bytes (httplib parses it with
//                           std::regex; the server ignores ranges anyway)
//   413 RESOURCE_EXHAUSTED  Content-Length above max_body_bytes (known from
//                           the head, so the body is never buffered)
//   411 UNIMPLEMENTED       Transfer-Encoding (chunked bodies): send
//                           Content-Length instead
//   415 UNIMPLEMENTED       Content-Encoding other than identity (httplib
//                           would inflate a compressed body past
//                           max_body_bytes): send the body uncompressed
//   501 UNIMPLEMENTED       a method httplib does not know ("FOO"), which
//                           it would answer as a malformed request
//   400 INVALID_ARGUMENT    a request line not "METHOD /path HTTP/x" with
//                           single spaces (httplib reads runs of spaces and
//                           a target led by '?' its own way); a header value
//                           holding a control character other than tab, as
//                           sent or as httplib decodes it ("%00": a NUL cut
//                           it short), or Authorization or Host given twice;
//                           no Host in a request other than HTTP/1.0 (RFC
//                           9112 3.2); a line of the head ending in a bare
//                           LF (the head's end is CRLF CRLF, so such a
//                           client would otherwise wait for the deadline);
//                           a '%' in the request line's path, all before
//                           the '?' ('#' and what follows included; httplib
//                           decodes it before routing, so an encoded ':'
//                           or '/' would reach another route than the raw
//                           path names; the query may hold escapes);
//                           Content-Length not a decimal number, or given
//                           twice with different values; a header line
//                           over 8192 bytes with its line end (httplib's
//                           limit, which it answers with a bare 400); a
//                           header name that is not a token ("Host : x",
//                           a folded line: RFC 9112 5.1)
#ifndef PIPETRAIN_COMMON_HTTP_FRAMING_H_
#define PIPETRAIN_COMMON_HTTP_FRAMING_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

struct HttpRequestLimits {
  size_t max_header_bytes = 16 * 1024;    // request line + headers + blank line
  size_t max_body_bytes = 1024 * 1024;    // Content-Length
  // The request line without its CRLF ("GET /v1/jobs?pageSize=10 HTTP/1.1").
  // Routing matches the path with std::regex, whose recursion takes stack in
  // proportion to the path: up to 0.75 KiB per byte (1.5 KiB under ASan), so
  // an 8 KiB path overflows a 2 MiB thread stack and 1 KiB stays within
  // 0.75 MiB (1.5 MiB). The API's longest lines (a 512-byte page token) fit.
  size_t max_request_line_bytes = 1024;
};

// Why a request was refused before a handler saw it: the HTTP status and
// the code (by name, e.g. "RESOURCE_EXHAUSTED") and message of its JSON
// error body (google.rpc.Status, common/http_response.h). Messages name the
// limit.
struct HttpRejection {
  int status = 0;
  std::string code;
  std::string message;
};

// One per connection (it remembers how far it has searched, so a request
// trickled in byte by byte costs linear, not quadratic, work). Not
// thread-safe.
class HttpRequestFramer {
 public:
  enum class Progress { kNeedMore, kComplete, kRejected };

  explicit HttpRequestFramer(HttpRequestLimits limits) : limits_(limits) {}

  // `received`: every byte of the connection so far; each call passes the
  // previous bytes plus any new ones. Once kComplete or kRejected, further
  // calls return the same answer.
  Progress Update(absl::string_view received);

  // After kComplete: head + body length. Bytes past it are not part of the
  // request (the server answers one request per connection).
  size_t request_bytes() const { return head_bytes_ + body_bytes_; }
  // After kRejected: why.
  const HttpRejection& rejection() const { return rejection_; }
  // True exactly once, when the head is complete, the body is still to come
  // and the client sent "Expect: 100-continue": answer "100 Continue" so it
  // sends the body now rather than after its own timeout.
  bool TakeContinue();

 private:
  Progress CheckRequestLine(absl::string_view received);
  // The complete request line (without its LF): its shape, method and path.
  Progress CheckLineShape(absl::string_view line);
  Progress FindHead(absl::string_view received);
  Progress ParseHead(absl::string_view head);
  // kRejected, or kNeedMore for a header that is acceptable.
  Progress OnHeader(absl::string_view name, absl::string_view value, bool& has_length);
  Progress Reject(int status, std::string code, std::string message);
  Progress RejectBareLineFeed();

  const HttpRequestLimits limits_;
  Progress progress_ = Progress::kNeedMore;
  size_t searched_ = 0;    // bytes already searched for the end of the head
  size_t line_searched_ = 0;   // bytes already searched for the end of the request line
  size_t lf_searched_ = 0;     // bytes of the head already checked for bare LFs
  bool needs_host_ = false;    // the request line's version requires a Host header
  bool line_checked_ = false;  // the request line is complete and within its limit
  size_t head_bytes_ = 0;  // 0 until the head is complete
  uint64_t body_bytes_ = 0;
  bool expects_continue_ = false;
  std::set<std::string> seen_once_;  // headers that may appear once, seen
  HttpRejection rejection_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_HTTP_FRAMING_H_
