#include "common/http_framing.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using Progress = HttpRequestFramer::Progress;

constexpr HttpRequestLimits kLimits = {/*max_header_bytes=*/256, /*max_body_bytes=*/64};

// Feeds `bytes` one at a time, as a trickling client sends them; returns
// the progress after the last.
Progress FeedByteByByte(HttpRequestFramer& framer, const std::string& bytes) {
  Progress progress = Progress::kNeedMore;
  for (size_t i = 1; i <= bytes.size(); ++i) progress = framer.Update(bytes.substr(0, i));
  return progress;
}

TEST(HttpRequestFramer, Update_HeadByteByByte_CompleteOnlyAtTheBlankLine) {
  const std::string head = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(FeedByteByByte(framer, head.substr(0, head.size() - 1)), Progress::kNeedMore);
  EXPECT_EQ(framer.Update(head), Progress::kComplete);
  EXPECT_EQ(framer.request_bytes(), head.size());
}

TEST(HttpRequestFramer, Update_BodyArrivesLater_CompleteWithContentLength) {
  const std::string head = "POST /v1/jobs HTTP/1.1\r\nHost: t\r\ncontent-length: 5\r\n\r\n";
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update(head), Progress::kNeedMore);
  EXPECT_EQ(framer.Update(head + "abcd"), Progress::kNeedMore);
  EXPECT_EQ(framer.Update(head + "abcde" + "GET / HTTP/1.1\r\nHost: t\r\n"), Progress::kComplete);
  EXPECT_EQ(framer.request_bytes(), head.size() + 5);  // not the bytes after the body
}

TEST(HttpRequestFramer, Update_PostWithoutContentLength_CompleteWithEmptyBody) {
  const std::string head = "POST /v1/jobs/job-1:cancel HTTP/1.1\r\nHost: x\r\n\r\n";
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update(head), Progress::kComplete);
  EXPECT_EQ(framer.request_bytes(), head.size());
}

TEST(HttpRequestFramer, Update_UnfinishedHeadOverLimit_Rejected431NamingTheLimit) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update("GET / HTTP/1.1\r\nHost: t\r\nX: " + std::string(300, 'a')),
            Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 431);
  EXPECT_EQ(framer.rejection().code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(framer.rejection().message, "request line and headers exceed the limit of 256 bytes");
}

TEST(HttpRequestFramer, Update_CompleteHeadOverLimit_Rejected431WithItsSize) {
  const std::string head = "GET / HTTP/1.1\r\nHost: t\r\nX: " + std::string(300, 'a') + "\r\n\r\n";
  HttpRequestFramer framer({/*max_header_bytes=*/256, /*max_body_bytes=*/64});
  // Arrives in one read, so the limit is checked on a complete head.
  EXPECT_EQ(framer.Update(head), Progress::kRejected);
  EXPECT_EQ(framer.rejection().message,
            "request line and headers of 332 bytes exceed the limit of 256 bytes");
}

TEST(HttpRequestFramer, Update_HeadOfExactlyTheLimit_Accepted) {
  std::string head = "GET / HTTP/1.1\r\nHost: t\r\nX: ";
  head += std::string(256 - head.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(head.size(), 256u);
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(FeedByteByByte(framer, head), Progress::kComplete);
}

// Routing runs std::regex over the path, whose recursion needs stack in
// proportion to it: a long target must not reach it.
TEST(HttpRequestFramer, Update_RequestLineOverLimit_Rejected414NamingTheLimit) {
  const std::string line = "GET /" + std::string(1011, 'a') + " HTTP/1.1";  // 1025 bytes
  HttpRequestFramer framer(HttpRequestLimits{});
  EXPECT_EQ(framer.Update(line + "\r\nHost: x\r\n\r\n"), Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 414);
  EXPECT_EQ(framer.rejection().code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(framer.rejection().message,
            "request line (method, path and query) exceeds the limit of 1024 bytes");
}

TEST(HttpRequestFramer, Update_RequestLineTricklingPastLimit_Rejected414BeforeItsEnd) {
  HttpRequestFramer framer(HttpRequestLimits{});
  const std::string line = "GET /" + std::string(2000, 'a');
  EXPECT_EQ(FeedByteByByte(framer, line.substr(0, 1025)), Progress::kNeedMore);
  EXPECT_EQ(framer.Update(line.substr(0, 1026)), Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 414);
  EXPECT_EQ(framer.rejection().message,
            "request line (method, path and query) exceeds the limit of 1024 bytes");
}

TEST(HttpRequestFramer, Update_RequestLineOfExactlyTheLimit_Accepted) {
  std::string line = "GET /";
  line += std::string(1024 - line.size() - 9, 'a') + " HTTP/1.1";
  ASSERT_EQ(line.size(), 1024u);
  HttpRequestFramer framer(HttpRequestLimits{});
  EXPECT_EQ(FeedByteByByte(framer, line + "\r\nHost: t\r\n\r\n"), Progress::kComplete);
}

// httplib reads a run of spaces, or a target led by '?', its own way
// ("POST ?/v1/jobs/j%3Acancel" routed /v1/jobs/j:cancel): only the plain
// shape is taken, so the path checked is the path routed.
TEST(HttpRequestFramer, Update_RequestLineOfAnotherShape_Rejected400) {
  for (const char* line :
       {"POST  /v1/jobs/j%3Acancel HTTP/1.1", "POST ?/v1/jobs/j%3Acancel HTTP/1.1",
        "GET /v1/jobs HTTP/1.1 extra", "GET /v1/jobs", "PRI * HTTP/2.0", "GET  HTTP/1.1"}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(FeedByteByByte(framer, std::string(line) + "\r\n\r\n"), Progress::kRejected) << line;
    EXPECT_EQ(framer.rejection().status, 400) << line;
    EXPECT_EQ(framer.rejection().code, "INVALID_ARGUMENT") << line;
  }
}

// A method nobody implements is 501, not httplib's "malformed" 400; the
// methods httplib parses go on to the server's 405 with Allow.
TEST(HttpRequestFramer, Update_UnknownMethod_Rejected501_KnownOnesPass) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(FeedByteByByte(framer, "FOO /v1/jobs HTTP/1.1\r\nHost: t\r\n\r\n"),
            Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 501);
  EXPECT_EQ(framer.rejection().code, "UNIMPLEMENTED");
  EXPECT_EQ(framer.rejection().message,
            "method FOO is not implemented; the API takes GET, HEAD and POST");
  for (const char* method : {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"}) {
    HttpRequestFramer known(kLimits);
    EXPECT_EQ(known.Update(absl::StrCat(method, " / HTTP/1.1\r\nHost: t\r\n\r\n")),
              Progress::kComplete)
        << method;
  }
}

// httplib decodes the path before routing: "%3A" reached the ":cancel"
// route past a proxy rule on the raw path. Refused in the path, allowed in
// the query.
TEST(HttpRequestFramer, Update_PercentInThePath_Rejected400_InTheQueryAccepted) {
  for (const char* line :
       {"POST /v1/jobs/job-1%3Acancel HTTP/1.1", "GET /v1/jobs/a%2Fplan HTTP/1.1",
        "GET /%68ealthz HTTP/1.1", "GET /v1/jobs/a%2Fplan#x HTTP/1.1",
        "POST /v1/jobs/job-1#%3Acancel HTTP/1.1"}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(FeedByteByByte(framer, std::string(line) + "\r\n\r\n"), Progress::kRejected) << line;
    EXPECT_EQ(framer.rejection().status, 400);
    EXPECT_EQ(framer.rejection().code, "INVALID_ARGUMENT");
    EXPECT_EQ(framer.rejection().message,
              "percent-encoded characters in the path: no route or id needs them (the query may "
              "use them)");
  }
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update("GET /v1/jobs?pageToken=a%3D HTTP/1.1\r\nHost: t\r\n\r\n"),
            Progress::kComplete);
}

TEST(HttpRequestFramer, Update_ContentLengthOverLimit_Rejected413BeforeTheBody) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 65\r\n\r\n"),
            Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 413);
  EXPECT_EQ(framer.rejection().code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(framer.rejection().message, "request body of 65 bytes exceeds the limit of 64 bytes");
}

TEST(HttpRequestFramer, Update_ChunkedBody_Rejected411) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 411);
  EXPECT_EQ(framer.rejection().code, "UNIMPLEMENTED");
}

// httplib would inflate a compressed body past max_body_bytes, which
// bounds only the bytes on the wire.
TEST(HttpRequestFramer, Update_CompressedBody_Rejected415NamingTheEncoding) {
  for (const char* encoding : {"gzip", "deflate", "br", "GZIP", "x-gzip", "identity, gzip", ""}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(framer.Update(std::string("POST / HTTP/1.1\r\nHost: t\r\nContent-Encoding: ") +
                            encoding + "\r\nContent-Length: 3\r\n\r\nabc"),
              Progress::kRejected)
        << encoding;
    EXPECT_EQ(framer.rejection().status, 415) << encoding;
    EXPECT_EQ(framer.rejection().code, "UNIMPLEMENTED") << encoding;
    EXPECT_EQ(framer.rejection().message, std::string("request bodies with Content-Encoding \"") +
                                              encoding +
                                              "\" are not accepted; send the body uncompressed");
  }
}

TEST(HttpRequestFramer, Update_IdentityContentEncoding_Accepted) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update(
                "POST / HTTP/1.1\r\nHost: t\r\ncontent-encoding: Identity\r\nContent-Length: 3\r\n"
                "\r\nabc"),
            Progress::kComplete);
}

TEST(HttpRequestFramer, Update_LongRange_Rejected431) {
  HttpRequestFramer framer({/*max_header_bytes=*/1024, /*max_body_bytes=*/64});
  EXPECT_EQ(framer.Update("GET / HTTP/1.1\r\nHost: t\r\nrange: bytes=" + std::string(251, '1') +
                          "\r\n\r\n"),
            Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 431);
  EXPECT_EQ(framer.rejection().message,
            "Range header of 257 bytes exceeds the limit of 256 bytes; the server ignores Range: "
            "send none");
  HttpRequestFramer at_limit({/*max_header_bytes=*/1024, /*max_body_bytes=*/64});
  EXPECT_EQ(at_limit.Update("GET / HTTP/1.1\r\nHost: t\r\nRange: bytes=" + std::string(250, '1') +
                            "\r\n\r\n"),
            Progress::kComplete);
}

// httplib answers a header line over 8192 bytes (with its CRLF) with a bare
// 400; the framer refuses it first, naming the limit.
TEST(HttpRequestFramer, Update_HeaderLineOverLimit_Rejected400NamingTheLimit) {
  const HttpRequestLimits roomy = {/*max_header_bytes=*/16384, /*max_body_bytes=*/64};
  // "X-A: " + value + "\r\n": 8193 bytes, then 8192.
  HttpRequestFramer over(roomy);
  EXPECT_EQ(over.Update("GET / HTTP/1.1\r\nHost: t\r\nX-A: " + std::string(8186, 'a') + "\r\n\r\n"),
            Progress::kRejected);
  EXPECT_EQ(over.rejection().status, 400);
  EXPECT_EQ(over.rejection().code, "INVALID_ARGUMENT");
  EXPECT_EQ(over.rejection().message,
            "a header line of 8193 bytes exceeds the limit of 8192 bytes");
  HttpRequestFramer at_limit(roomy);
  EXPECT_EQ(
      at_limit.Update("GET / HTTP/1.1\r\nHost: t\r\nX-A: " + std::string(8185, 'a') + "\r\n\r\n"),
      Progress::kComplete);
}

// httplib would end a line at a bare LF, but the head ends at CRLF CRLF, so
// such a client waited for the deadline (408), and a header behind a bare
// LF was one httplib read: refused as soon as the bare LF arrives.
TEST(HttpRequestFramer, Update_BareLineFeed_Rejected400AtOnce) {
  for (const std::string request :
       {"GET / HTTP/1.1\n", "GET / HTTP/1.1\r\nHost: t\n",
        "POST / HTTP/1.1\r\nHost: t\r\nX: a\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\n\n"}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(FeedByteByByte(framer, request), Progress::kRejected) << absl::CEscape(request);
    EXPECT_EQ(framer.rejection().status, 400);
    EXPECT_EQ(framer.rejection().message,
              "a line of the request head ends in a bare LF; end every line with CRLF");
  }
  HttpRequestFramer body(kLimits);  // the body is not lines: LFs there are data
  EXPECT_EQ(body.Update("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\na\nb"),
            Progress::kComplete);
}

// Found by http_pieces_fuzzer: a bare LF past the head's limit was refused
// (400) when it arrived in the same read as the bytes over the limit, and
// 431 when it came later. Past the limit the limit decides, however cut.
TEST(HttpRequestFramer, Update_BareLineFeedPastTheHeadLimit_Rejected431HoweverCut) {
  const HttpRequestLimits small{/*max_header_bytes=*/64, /*max_body_bytes=*/8};
  const std::string request = "GET / HTTP/1.1\r\nHost: t\r\nX: " + std::string(60, 'a') + "\n\r\n";
  HttpRequestFramer at_once(small);
  EXPECT_EQ(at_once.Update(request), Progress::kRejected);
  EXPECT_EQ(at_once.rejection().status, 431);
  HttpRequestFramer trickled(small);
  EXPECT_EQ(FeedByteByByte(trickled, request), Progress::kRejected);
  EXPECT_EQ(trickled.rejection().status, 431);
}

// RFC 9112 3.2: a server must refuse an HTTP/1.1 request without Host.
TEST(HttpRequestFramer, Update_NoHost_Rejected400UnlessHttp10) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update("GET / HTTP/1.1\r\nX-Host: t\r\n\r\n"), Progress::kRejected);
  EXPECT_EQ(framer.rejection().status, 400);
  EXPECT_EQ(framer.rejection().message,
            "missing Host header: HTTP/1.1 requests must name the host (RFC 9112 3.2)");
  HttpRequestFramer lower_case(kLimits);
  EXPECT_EQ(lower_case.Update("GET / HTTP/1.1\r\nhost: t\r\n\r\n"), Progress::kComplete);
  HttpRequestFramer http10(kLimits);
  EXPECT_EQ(http10.Update("GET / HTTP/1.0\r\n\r\n"), Progress::kComplete);
}

TEST(HttpRequestFramer, Update_MalformedContentLength_Rejected400) {
  for (const char* value : {"-1", "+5", "0x10", "5 5", "", "1234567890123456789"}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(framer.Update(std::string("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: ") + value +
                            "\r\n\r\n"),
              Progress::kRejected)
        << value;
    EXPECT_EQ(framer.rejection().status, 400) << value;
    EXPECT_EQ(framer.rejection().code, "INVALID_ARGUMENT") << value;
  }
}

TEST(HttpRequestFramer, Update_TwoDifferentContentLengths_Rejected400) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(
      framer.Update("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
      Progress::kRejected);
  EXPECT_EQ(framer.rejection().message,
            "Content-Length given twice with different values (1 and 2)");
}

// A NUL cut a value short where httplib read it ("Bearer t\0junk" was the
// token "t"); no field value may hold control characters but tab.
TEST(HttpRequestFramer, Update_ControlCharacterInAHeaderValue_Rejected400) {
  for (const std::string& value :
       {std::string("Bearer s3cret\0junk", 18), std::string("a\x01b"), std::string("a\x7f")}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(framer.Update("GET / HTTP/1.1\r\nHost: t\r\nAuthorization: " + value + "\r\n\r\n"),
              Progress::kRejected);
    EXPECT_EQ(framer.rejection().status, 400);
    EXPECT_EQ(framer.rejection().message, "header Authorization holds a control character");
  }
  // As httplib decodes header values: "%00", "%u0000", "%7F"; and \v, which
  // a strip of all whitespace took away.
  for (const std::string& value : {std::string("Bearer t%00junk"), std::string("a%u0001"),
                                   std::string("a%7f"), std::string("\va")}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(framer.Update("GET / HTTP/1.1\r\nHost: t\r\nAuthorization: " + value + "\r\n\r\n"),
              Progress::kRejected)
        << value;
  }
  HttpRequestFramer tab(kLimits);
  EXPECT_EQ(tab.Update("GET / HTTP/1.1\r\nHost: t\r\nX-A: a\tb %41%2 %zz%u00\r\n\r\n"),
            Progress::kComplete);
}

// Two Authorization or Host headers: which counts differs between a proxy
// and this server (it took the first). Refused; other repeats are not.
TEST(HttpRequestFramer, Update_AuthorizationOrHostTwice_Rejected400) {
  for (const char* name : {"Authorization", "Host"}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(framer.Update(absl::StrCat("GET / HTTP/1.1\r\nHost: t\r\n", name, ": a\r\n",
                                         absl::AsciiStrToLower(name), ": b\r\n\r\n")),
              Progress::kRejected)
        << name;
    EXPECT_EQ(framer.rejection().message, absl::StrCat("header ", name, " given twice"));
  }
  HttpRequestFramer other(kLimits);
  EXPECT_EQ(other.Update("GET / HTTP/1.1\r\nHost: a\r\nAccept: x\r\nAccept: y\r\n\r\n"),
            Progress::kComplete);
}

// "Host : evil" is not a second Host to a parser that keeps the space in
// the name (or drops the line): a name is a token, nothing else, or 400.
TEST(HttpRequestFramer, Update_WhitespaceInAHeaderName_Rejected400) {
  for (const char* line :
       {"Host : evil", "Authorization\t: Bearer x", " Folded: x", ": x", "Content-Length : 5"}) {
    HttpRequestFramer framer(kLimits);
    EXPECT_EQ(framer.Update(absl::StrCat("GET / HTTP/1.1\r\nHost: t\r\n", line, "\r\n\r\n")),
              Progress::kRejected)
        << line;
    EXPECT_EQ(framer.rejection().status, 400) << line;
    EXPECT_TRUE(absl::StrContains(framer.rejection().message, "is not a token")) << line;
  }
  HttpRequestFramer fine(kLimits);
  EXPECT_EQ(fine.Update("GET / HTTP/1.1\r\nHost: t\r\nX-Odd_Name.1~: v\r\n\r\n"),
            Progress::kComplete);
}

TEST(HttpRequestFramer, Update_RepeatedEqualContentLength_Accepted) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(framer.Update(
                "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"),
            Progress::kComplete);
}

TEST(HttpRequestFramer, TakeContinue_ExpectContinueBodyPending_TrueOnce) {
  const std::string head =
      "POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  HttpRequestFramer framer(kLimits);
  EXPECT_FALSE(framer.TakeContinue());  // no head yet
  EXPECT_EQ(framer.Update(head), Progress::kNeedMore);
  EXPECT_TRUE(framer.TakeContinue());
  EXPECT_FALSE(framer.TakeContinue());
  EXPECT_EQ(framer.Update(head + "ab"), Progress::kComplete);
}

TEST(HttpRequestFramer, TakeContinue_BodyAlreadyHere_False) {
  HttpRequestFramer framer(kLimits);
  EXPECT_EQ(
      framer.Update(
          "POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab"),
      Progress::kComplete);
  EXPECT_FALSE(framer.TakeContinue());
}

TEST(HttpRequestFramer, Update_AfterRejection_StaysRejected) {
  HttpRequestFramer framer(kLimits);
  const std::string chunked = "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(framer.Update(chunked), Progress::kRejected);
  EXPECT_EQ(framer.Update(chunked + "0\r\n\r\n"), Progress::kRejected);
}

}  // namespace
}  // namespace pipetrain
