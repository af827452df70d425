#include "common/http_framing.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pipetrain {
namespace {

constexpr absl::string_view kHeadEnd = "\r\n\r\n";
constexpr size_t kMaxRangeBytes = 256;
// httplib's CPPHTTPLIB_HEADER_MAX_LENGTH: one header line with its CRLF.
constexpr size_t kMaxHeaderLineBytes = 8192;

// Decimal digits only: no sign, no inner spaces, no hex. 18 digits cannot
// overflow uint64_t and are far above any limit.
bool ParseContentLength(absl::string_view value, uint64_t* length) {
  if (value.empty() || value.size() > 18) return false;
  for (char c : value) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(value, length);
}

}  // namespace

HttpRequestFramer::Progress HttpRequestFramer::Update(absl::string_view received) {
  if (progress_ != Progress::kNeedMore) return progress_;
  if (head_bytes_ == 0) {
    progress_ = CheckRequestLine(received);
    if (progress_ == Progress::kRejected) return progress_;
    progress_ = FindHead(received);
    if (progress_ != Progress::kComplete) return progress_;
    progress_ = Progress::kNeedMore;  // the head is; the body may not be
  }
  if (received.size() < request_bytes()) return Progress::kNeedMore;
  return progress_ = Progress::kComplete;
}

bool HttpRequestFramer::TakeContinue() {
  const bool answer = expects_continue_ && head_bytes_ > 0 && body_bytes_ > 0 &&
                      progress_ == Progress::kNeedMore;
  expects_continue_ = false;
  return answer;
}

// kNeedMore while the request line is within its limit, complete or not.
// Searches at most the limit's bytes, each once.
HttpRequestFramer::Progress HttpRequestFramer::CheckRequestLine(absl::string_view received) {
  if (line_checked_) return Progress::kNeedMore;
  const size_t limit = limits_.max_request_line_bytes;
  // httplib ends the line at LF; a line of `limit` bytes has its CRLF within these.
  const absl::string_view window = received.substr(0, limit + 2);
  const size_t end = window.find('\n', line_searched_);
  if (end == absl::string_view::npos) {
    line_searched_ = window.size();
    if (window.size() < limit + 2) return Progress::kNeedMore;
  } else if ((end > 0 && window[end - 1] == '\r' ? end - 1 : end) <= limit) {
    line_checked_ = true;
    if (end == 0 || window[end - 1] != '\r') return RejectBareLineFeed();
    return CheckLineShape(window.substr(0, end));
  }
  return Reject(
      414, "RESOURCE_EXHAUSTED",
      absl::StrCat("request line (method, path and query) exceeds the limit of ", limit, " bytes"));
}

// The request line as this server takes it: "METHOD SP /path[?query] SP
// HTTP/x", single spaces. httplib reads lines more leniently (runs of
// spaces, a target led by '?') and decodes the path before routing, so a
// check of any other shape could read a different path than it routes:
// "/v1/jobs/j%3Acancel" reached the :cancel route past a proxy rule on the
// raw path, and %2F made one segment two. No route or id needs encoding.
HttpRequestFramer::Progress HttpRequestFramer::CheckLineShape(absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
      !absl::StartsWith(parts[2], "HTTP/")) {
    return Reject(400, "INVALID_ARGUMENT",
                  "malformed request line: want METHOD /path HTTP/1.1, with single spaces");
  }
  // HTTP/1.0 predates Host; every later version requires it (RFC 9112 3.2).
  needs_host_ = parts[2] != "HTTP/1.0";
  // httplib answers a method it does not know as a malformed request; it is
  // one this server does not implement (RFC 9110 15.6.2).
  bool known = false;
  for (const char* m :
       {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT", "PRI"}) {
    known = known || parts[0] == m;
  }
  if (!known) {
    return Reject(501, "UNIMPLEMENTED",
                  absl::StrCat("method ", absl::CHexEscape(parts[0].substr(0, 32)),
                               " is not implemented; the API takes GET, HEAD and POST"));
  }
  if (parts[1][0] != '/') {
    return Reject(400, "INVALID_ARGUMENT",
                  "the request target must be a path starting with '/' (origin form)");
  }
  // Everything before the query: httplib splits the target at '?' alone and
  // decodes all before it, a '#' and what follows included (a fragment is
  // never sent, RFC 9112 3.2): "/v1/jobs/job-1#%3Acancel" reached the
  // ":cancel" route.
  const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path.find('%') != absl::string_view::npos) {
    return Reject(400, "INVALID_ARGUMENT",
                  "percent-encoded characters in the path: no route or id needs them (the "
                  "query may use them)");
  }
  return Progress::kNeedMore;
}

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsControl(int u) { return (u < 0x20 && u != '\t') || u == 0x7f; }

// RFC 9110 5.6.2: the characters of a token (a header field's name).
bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

// Whether `value` holds a control character other than tab, as sent or as
// httplib's decoding of header values makes it ("%00", "%u0000").
bool HoldsControl(absl::string_view value) {
  for (size_t i = 0; i < value.size(); ++i) {
    if (IsControl(static_cast<unsigned char>(value[i]))) return true;
    if (value[i] != '%') continue;
    int code = -1;
    if (i + 2 < value.size() && HexValue(value[i + 1]) >= 0 && HexValue(value[i + 2]) >= 0) {
      code = HexValue(value[i + 1]) * 16 + HexValue(value[i + 2]);
    }
    if (i + 5 < value.size() && (value[i + 1] == 'u' || value[i + 1] == 'U')) {
      int u = 0;
      for (size_t k = i + 2; k < i + 6 && u >= 0; ++k) {
        u = HexValue(value[k]) < 0 ? -1 : u * 16 + HexValue(value[k]);
      }
      if (u >= 0) code = u;
    }
    if (code >= 0 && IsControl(code)) return true;
  }
  return false;
}

}  // namespace

// kComplete here means the head is complete and acceptable.
HttpRequestFramer::Progress HttpRequestFramer::FindHead(absl::string_view received) {
  // The terminator may straddle the bytes searched before and the new ones.
  const size_t from = searched_ >= kHeadEnd.size() ? searched_ - (kHeadEnd.size() - 1) : 0;
  const size_t end = received.find(kHeadEnd, from);
  // Every line of the head ends in CRLF. httplib would also end a line at a
  // bare LF, but the head's end is found as CRLF CRLF, so a client ending
  // its lines in LF alone would wait for the request deadline (408); it is
  // told at once instead (RFC 9112 2.2 lets a server refuse them). Only
  // within the head's limit: a bare LF past it would be found or not
  // depending on how the bytes were cut into reads, where the limit's 431
  // is decided the same either way (http_pieces_fuzzer checks that no
  // decision depends on the cuts).
  const absl::string_view head = received.substr(
      0, std::min(end == absl::string_view::npos ? received.size() : end + kHeadEnd.size(),
                  limits_.max_header_bytes + 1));
  for (size_t lf = head.find('\n', lf_searched_); lf != absl::string_view::npos;
       lf = head.find('\n', lf + 1)) {
    if (lf == 0 || head[lf - 1] != '\r') return RejectBareLineFeed();
  }
  lf_searched_ = head.size();
  if (end == absl::string_view::npos) {
    searched_ = received.size();
    if (received.size() <= limits_.max_header_bytes) return Progress::kNeedMore;
    return Reject(431, "RESOURCE_EXHAUSTED",
                  absl::StrCat("request line and headers exceed the limit of ",
                               limits_.max_header_bytes, " bytes"));
  }
  const size_t head_bytes = end + kHeadEnd.size();
  if (head_bytes > limits_.max_header_bytes) {
    return Reject(431, "RESOURCE_EXHAUSTED",
                  absl::StrCat("request line and headers of ", head_bytes,
                               " bytes exceed the limit of ", limits_.max_header_bytes, " bytes"));
  }
  head_bytes_ = head_bytes;
  return ParseHead(received.substr(0, head_bytes));
}

// Reads the headers that frame the body; everything else is left to the
// HTTP parser, which sees exactly the bytes framed here.
HttpRequestFramer::Progress HttpRequestFramer::ParseHead(absl::string_view head) {
  // Every line ends in CRLF (FindHead refused bare LFs); the CR goes with
  // the whitespace.
  const std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  bool has_length = false;
  for (size_t i = 1; i < lines.size(); ++i) {  // lines[0] is the request line
    // httplib refuses a longer line (with its line end) as a bare 400.
    if (lines[i].size() + 1 > kMaxHeaderLineBytes) {
      return Reject(400, "INVALID_ARGUMENT",
                    absl::StrCat("a header line of ", lines[i].size() + 1,
                                 " bytes exceeds the limit of ", kMaxHeaderLineBytes, " bytes"));
    }
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;  // the blank lines at the end
    // A field name is a token: "Host : evil" (whitespace before the colon,
    // RFC 9112 5.1) or a folded line would be one header here and another,
    // or none, to the parser behind (a second Host, an Authorization
    // unseen).
    if (const absl::string_view name = lines[i].substr(0, colon);
        name.empty() || !std::all_of(name.begin(), name.end(), IsTokenChar)) {
      return Reject(400, "INVALID_ARGUMENT",
                    absl::StrCat("header field name \"", absl::CHexEscape(name.substr(0, 64)),
                                 "\" is not a token (no whitespace before the colon; RFC 9112 "
                                 "5.1)"));
    }
    // Spaces and tabs around a value and the line's CR are not part of it
    // (httplib trims the same); anything else is, \v and \f included.
    absl::string_view value = lines[i].substr(colon + 1);
    if (!value.empty() && value.back() == '\r') value.remove_suffix(1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
      value.remove_prefix(1);
    }
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    const Progress header = OnHeader(lines[i].substr(0, colon), value, has_length);
    if (header == Progress::kRejected) return header;
  }
  if (needs_host_ && seen_once_.count("Host") == 0) {
    return Reject(400, "INVALID_ARGUMENT",
                  "missing Host header: HTTP/1.1 requests must name the host (RFC 9112 3.2)");
  }
  if (body_bytes_ > limits_.max_body_bytes) {
    return Reject(413, "RESOURCE_EXHAUSTED",
                  absl::StrCat("request body of ", body_bytes_, " bytes exceeds the limit of ",
                               limits_.max_body_bytes, " bytes"));
  }
  return Progress::kComplete;
}

HttpRequestFramer::Progress HttpRequestFramer::OnHeader(absl::string_view name,
                                                        absl::string_view value,
                                                        bool& has_length) {
  // A NUL cut the value short where httplib read it ("Bearer t\0junk" was
  // the token "t"), and no field value may hold control characters but tab
  // (RFC 9110 5.5).
  if (HoldsControl(value)) {
    return Reject(400, "INVALID_ARGUMENT",
                  absl::StrCat("header ", absl::CHexEscape(name.substr(0, 64)),
                               " holds a control character"));
  }
  // Which of two would count differs between proxies and this server (it
  // took the first): a request that names its credentials or host twice is
  // refused.
  for (const char* once : {"Authorization", "Host"}) {
    if (!absl::EqualsIgnoreCase(name, once)) continue;
    if (seen_once_.count(once) > 0) {
      return Reject(400, "INVALID_ARGUMENT", absl::StrCat("header ", once, " given twice"));
    }
    seen_once_.insert(once);
  }
  if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
    return Reject(411, "UNIMPLEMENTED",
                  "request bodies with Transfer-Encoding are not accepted; send the body "
                  "with a Content-Length header");
  }
  // httplib parses Range with a std::regex whose recursion takes stack in
  // proportion to the value (an 8 KiB one overflows a 2 MiB thread stack),
  // before the server gets to ignore it (http_server.cc).
  if (absl::EqualsIgnoreCase(name, "Range") && value.size() > kMaxRangeBytes) {
    return Reject(431, "RESOURCE_EXHAUSTED",
                  absl::StrCat("Range header of ", value.size(), " bytes exceeds the limit of ",
                               kMaxRangeBytes, " bytes; the server ignores Range: send none"));
  }
  // httplib inflates gzip, deflate and br bodies before a handler sees
  // them, and every limit here bounds the compressed bytes: a 254 KiB gzip
  // body would arrive as 256 MiB. The API takes no compressed bodies.
  if (absl::EqualsIgnoreCase(name, "Content-Encoding") &&
      !absl::EqualsIgnoreCase(value, "identity")) {
    return Reject(415, "UNIMPLEMENTED",
                  absl::StrCat("request bodies with Content-Encoding \"", value.substr(0, 64),
                               "\" are not accepted; send the body uncompressed"));
  }
  if (absl::EqualsIgnoreCase(name, "Expect")) {
    expects_continue_ = absl::EqualsIgnoreCase(value, "100-continue");
  } else if (absl::EqualsIgnoreCase(name, "Content-Length")) {
    uint64_t length = 0;
    if (!ParseContentLength(value, &length)) {
      return Reject(400, "INVALID_ARGUMENT",
                    absl::StrCat("Content-Length \"", value,
                                 "\" is not one decimal number of bytes"));
    }
    if (has_length && length != body_bytes_) {
      return Reject(400, "INVALID_ARGUMENT",
                    absl::StrCat("Content-Length given twice with different values (", body_bytes_,
                                 " and ", length, ")"));
    }
    has_length = true;
    body_bytes_ = length;
  }
  return Progress::kNeedMore;  // this header is acceptable
}

HttpRequestFramer::Progress HttpRequestFramer::RejectBareLineFeed() {
  return Reject(400, "INVALID_ARGUMENT",
                "a line of the request head ends in a bare LF; end every line with CRLF");
}

HttpRequestFramer::Progress HttpRequestFramer::Reject(int status, std::string code,
                                                      std::string message) {
  rejection_ = {status, std::move(code), std::move(message)};
  return Progress::kRejected;
}

}  // namespace pipetrain
