#include "common/secrets.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(ConstantTimeEqualsTest, EqualAndUnequal_ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("s3cret", "s3cret"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3creT"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3cre"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(RandomHexTest, Sizes_HexOfTwiceTheBytes_Distinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string token = RandomToken();
    ASSERT_EQ(token.size(), 64u);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
    seen.insert(token);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(RandomHex(1).size(), 2u);
}

// RFC 4231 test cases 1 and 2.
TEST(HmacSha256HexTest, Rfc4231Vectors_Match) {
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// FIPS 180-2's "abc" and empty-message digests, whole and in pieces.
TEST(Sha256HexTest, KnownDigests_WholeAndInPieces) {
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  const std::string empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  EXPECT_EQ(Sha256Hex("abc"), abc);
  EXPECT_EQ(Sha256HexOfPieces({"a", "", "bc"}), abc);
  EXPECT_EQ(Sha256HexOfPieces({"abc"}), abc);
  EXPECT_EQ(Sha256Hex(""), empty);
  EXPECT_EQ(Sha256HexOfPieces({}), empty);
  EXPECT_TRUE(IsSha256Hex(abc));
  EXPECT_FALSE(IsSha256Hex(abc.substr(1)));                      // 63 digits
  EXPECT_FALSE(IsSha256Hex(abc + "0"));                          // 65
  EXPECT_FALSE(IsSha256Hex("BA" + abc.substr(2)));               // upper case
  EXPECT_FALSE(IsSha256Hex(std::string(62, 'a') + "\xc3\xa9"));  // 64 bytes, not hex
}

// FIPS 180-2's million 'a's, given in uneven chunks.
TEST(Sha256StreamTest, MillionAs_InChunks) {
  Sha256Stream sha;
  const std::string chunk(4093, 'a');
  int64_t given = 0;
  while (given + 4093 <= 1000000) {
    sha.Update(chunk);
    given += 4093;
  }
  sha.Update(std::string(1000000 - given, 'a'));
  EXPECT_EQ(sha.FinishHex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// A token or key file: readable by others is what the warning is about;
// owner- or group-only (a Kubernetes Secret volume's 0440) is not.
TEST(ReadableByOthersTest, ModesOfTheFile) {
  const std::string path = WriteTemp("mode", "t0k3n");
  for (const auto& [mode, others] : std::vector<std::pair<mode_t, bool>>{
           {0600, false}, {0440, false}, {0644, true}, {0604, true}}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    EXPECT_EQ(ReadableByOthers(path), others) << std::oct << mode;
  }
  EXPECT_FALSE(ReadableByOthers(path + ".missing"));
}

TEST(ReadSecretFileTest, TrailingNewline_Stripped) {
  absl::StatusOr<std::string> s = ReadSecretFile("--user-token-file", WriteTemp("a", "abc123\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "abc123");
}

TEST(ReadSecretFileTest, Missing_NotFoundNamingFlag) {
  absl::StatusOr<std::string> s = ReadSecretFile("--join-token-file", "/nonexistent/x");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("--join-token-file"), std::string::npos);
}

// A directory is not an empty token file, and gets no warning about its mode.
TEST(ReadSecretFileTest, Directory_InvalidArgumentSayingSo) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR"));
  absl::StatusOr<std::string> s = ReadSecretFile("--token-file", dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--token-file: " + dir + " is a directory; name the file holding the token");
}

TEST(ReadSecretFileTest, EmptyOrSpacedOrHuge_InvalidArgumentWithoutTheSecret) {
  EXPECT_EQ(ReadSecretFile("f", WriteTemp("b", "\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> spaced = ReadSecretFile("f", WriteTemp("c", "two words\n"));
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spaced.status().message().find("two"), std::string::npos);
  EXPECT_EQ(ReadSecretFile("f", WriteTemp("d", std::string(kMaxSecretBytes + 1, 'x')))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A full-length token and its line end is read whole; anything after the
// line end makes the file too long, not cut at the limit.
TEST(ReadSecretFileTest, FullLengthToken_AcceptedAndNothingAfterIt) {
  const std::string full(kMaxSecretBytes, 'x');
  absl::StatusOr<std::string> s = ReadSecretFile("f", WriteTemp("e", full + "\r\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, full);
  EXPECT_EQ(ReadSecretFile("f", WriteTemp("g", full + "\nsecond line")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile("f", WriteTemp("h", full.substr(1) + "\r\nz")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SecretFromFlagsTest, ValueFileBothOrNeither) {
  EXPECT_EQ(SecretFromFlags("join-token", "v", "").value_or("?"), "v");
  EXPECT_EQ(SecretFromFlags("join-token", "", WriteTemp("e", "f\n")).value_or("?"), "f");
  EXPECT_EQ(SecretFromFlags("join-token", "", "").value_or("?"), "");
  absl::Status both = SecretFromFlags("join-token", "v", WriteTemp("g", "f")).status();
  EXPECT_EQ(both.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(both.message().find("--join-token and --join-token-file are exclusive"),
            std::string::npos);
}

// A value is checked as a file's contents are: a trailing space would
// match over gRPC and not over REST, whose library trims the header.
TEST(SecretFromFlagsTest, Value_CheckedAsAFilesToken) {
  EXPECT_EQ(SecretFromFlags("user-token", "abc\n", "").value_or("?"), "abc");
  const absl::Status spaced = SecretFromFlags("user-token", "abc ", "").status();
  EXPECT_EQ(spaced.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spaced.message(),
            "--user-token contains whitespace, control or non-ASCII characters; a token is one "
            "word of printable ASCII");
  // gRPC aborts the client on a header byte past 0x7e: a UTF-8 byte-order
  // mark (a token file saved by an editor) or an accented letter.
  for (const std::string token : {"\xef\xbb\xbftoken", "t\xc3\xb6ken", "token\x7f", "tok\xff"}) {
    EXPECT_EQ(SecretFromFlags("user-token", token, "").status().code(),
              absl::StatusCode::kInvalidArgument)
        << token;
  }
  EXPECT_EQ(SecretFromFlags("user-token", "!~tok", "").value_or("?"), "!~tok");
  // An etcd password travels in a request body: UTF-8 is fine there, but
  // whitespace still is not.
  EXPECT_EQ(
      CheckedSecret("--etcd-password-file", "p\xc3\xa4sswort", SecretUse::kPassword).value_or("?"),
      "p\xc3\xa4sswort");
  EXPECT_EQ(
      CheckedSecret("--etcd-password-file", "pass word", SecretUse::kPassword).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SecretFromFlags("user-token", std::string(kMaxSecretBytes + 1, 'a'), "").status().message(),
      absl::StrCat("--user-token holds more than ", kMaxSecretBytes, " bytes"));
}

TEST(BearerTokenTest, Forms_TokenOrEmpty) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer abc"), "abc");  // the scheme is case-insensitive
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken(""), "");
}

}  // namespace
}  // namespace pipetrain
