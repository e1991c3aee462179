#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "diaspora/event.hpp"
#include "diaspora/token.hpp"
#include "test_helpers.hpp"

using namespace std::chrono_literals;
using diaspora::TokenErrc;
using diaspora::TokenError;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef-test-secret";

diaspora::SysSeconds t0() { return diaspora::SysSeconds(std::chrono::seconds(1'800'000'000)); }

diaspora::TokenClaims claims(std::vector<std::string> scopes) {
  diaspora::TokenClaims c;
  c.subject = "plugin-edge";
  c.scopes = std::move(scopes);
  c.issued_at = t0();
  c.expires_at = t0() + 1h;
  return c;
}

TokenErrc refusal(const diaspora::TokenVerifier& v, const std::string& token, diaspora::SysSeconds now = t0()) {
  try {
    v.verify(token, now);
  } catch (const TokenError& e) {
    return e.code();
  }
  ADD_FAILURE() << "accepted " << token;
  return TokenErrc::malformed;
}

std::string b64url(const std::string& s) {
  std::string b = diaspora::base64_encode(s);
  while (!b.empty() && b.back() == '=') b.pop_back();
  for (char& c : b) c = c == '+' ? '-' : c == '/' ? '_' : c;
  return b;
}

}  // namespace

TEST(Token, IssueThenVerify) {
  diaspora::TokenVerifier v(kSecret);
  std::string tok = diaspora::issue_token(kSecret, claims({"publish:task.*", "subscribe:*"}));
  auto c = v.verify(tok, t0() + 10min);
  EXPECT_EQ(c.subject, "plugin-edge");
  EXPECT_EQ(c.scopes, (std::vector<std::string>{"publish:task.*", "subscribe:*"}));
  EXPECT_EQ(c.expires_at, t0() + 1h);
  EXPECT_FALSE(c.token_id.empty());
}

TEST(Token, TamperedTokensAreRefused) {
  diaspora::TokenVerifier v(kSecret);
  std::string tok = diaspora::issue_token(kSecret, claims({"subscribe:task.*"}));
  auto dot1 = tok.find('.'), dot2 = tok.rfind('.');
  // Swap in a payload granting admin, keep the old signature.
  std::string forged_payload = b64url(R"({"sub":"plugin-edge","scope":["admin"],"exp":1900000000})");
  EXPECT_EQ(refusal(v, tok.substr(0, dot1 + 1) + forged_payload + tok.substr(dot2)), TokenErrc::bad_signature);
  // Change one signature character away from the end (the last one also carries padding
  // bits, whose change is refused earlier as non-canonical base64url).
  std::string flipped = tok;
  char& c = flipped[dot2 + 5];
  c = c == 'A' ? 'B' : 'A';
  EXPECT_EQ(refusal(v, flipped), TokenErrc::bad_signature);
  std::string padding_bits = tok;
  padding_bits.back() = padding_bits.back() == 'A' ? 'B' : 'A';
  EXPECT_THROW(v.verify(padding_bits, t0()), TokenError);
  diaspora::TokenVerifier other(std::string(40, 'z'));
  EXPECT_EQ(refusal(other, tok), TokenErrc::bad_signature);
}

TEST(Token, AlgNoneAndOtherAlgorithmsAreRefused) {
  diaspora::TokenVerifier v(kSecret);
  std::string payload = b64url(R"({"sub":"x","scope":["admin"],"exp":1900000000})");
  EXPECT_EQ(refusal(v, b64url(R"({"alg":"none","typ":"JWT"})") + "." + payload + "."), TokenErrc::unsupported_algorithm);
  EXPECT_EQ(refusal(v, b64url(R"({"alg":"HS512"})") + "." + payload + ".c2ln"), TokenErrc::unsupported_algorithm);
  EXPECT_EQ(refusal(v, b64url(R"({"alg":"RS256"})") + "." + payload + ".c2ln"), TokenErrc::unsupported_algorithm);
}

TEST(Token, ExpiryAndNotBeforeWithLeeway) {
  diaspora::TokenVerifier v(kSecret, 30s);
  auto c = claims({"admin"});
  c.not_before = t0() + 10min;
  std::string tok = diaspora::issue_token(kSecret, c);
  EXPECT_EQ(refusal(v, tok, t0()), TokenErrc::not_yet_valid);
  EXPECT_NO_THROW(v.verify(tok, t0() + 10min - 20s));  // inside the leeway
  EXPECT_NO_THROW(v.verify(tok, t0() + 1h + 20s));
  EXPECT_EQ(refusal(v, tok, t0() + 1h + 31s), TokenErrc::expired);
}

TEST(Token, MalformedAndMissingClaims) {
  diaspora::TokenVerifier v(kSecret);
  EXPECT_EQ(refusal(v, "not-a-token"), TokenErrc::malformed);
  EXPECT_EQ(refusal(v, "a.b.c.d"), TokenErrc::malformed);
  EXPECT_EQ(refusal(v, "!!.??.**"), TokenErrc::malformed);
  auto c = claims({"admin"});
  c.subject.clear();
  EXPECT_THROW(diaspora::issue_token(kSecret, c), TokenError);
  EXPECT_THROW(diaspora::issue_token("short", claims({"admin"})), TokenError);
  EXPECT_THROW(diaspora::TokenVerifier("short"), TokenError);
}

TEST(Token, ScopesMatchTopicPatterns) {
  using diaspora::scopes_allow;
  using diaspora::topic_matches;
  EXPECT_TRUE(topic_matches("task.*", "task.started"));
  EXPECT_TRUE(topic_matches("task.*", "task.a.b"));
  EXPECT_FALSE(topic_matches("task.*", "task"));
  EXPECT_TRUE(topic_matches("*", "anything"));
  EXPECT_TRUE(topic_matches("wf.*.status", "wf.edge.status"));
  EXPECT_FALSE(topic_matches("wf.*.status", "wf.edge.status.x"));
  EXPECT_FALSE(topic_matches("task.started", "task.startedx"));
  std::vector<std::string> s = {"publish:task.*", "subscribe:control.edge"};
  EXPECT_TRUE(scopes_allow(s, "publish", "task.x"));
  EXPECT_FALSE(scopes_allow(s, "subscribe", "task.x"));
  EXPECT_TRUE(scopes_allow(s, "subscribe", "control.edge"));
  EXPECT_FALSE(scopes_allow(s, "publish", "control.edge"));
  EXPECT_TRUE(scopes_allow({"admin"}, "publish", "x"));
}

TEST(Token, AuthorizeRefusesWrongScopeWithItsOwnCode) {
  diaspora::TokenVerifier v(kSecret);
  auto c = claims({"subscribe:task.*"});
  auto now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  c.issued_at = now;
  c.expires_at = now + 1h;
  std::string tok = diaspora::issue_token(kSecret, c);
  EXPECT_NO_THROW(v.authorize(tok, "subscribe", "task.started"));
  try {
    v.authorize(tok, "publish", "task.started");
    FAIL();
  } catch (const TokenError& e) {
    EXPECT_EQ(e.code(), TokenErrc::insufficient_scope);
    EXPECT_NE(std::string(e.what()).find("publish"), std::string::npos);
  }
}

TEST(Token, SecretFiles) {
  diaspora::test::TempDir dir;
  auto f = dir.path() / "secret";
  diaspora::write_secret_file(f);
  EXPECT_EQ(std::filesystem::status(f).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::string s = diaspora::load_secret_file(f);
  EXPECT_EQ(s.size(), 64u);
  EXPECT_THROW(diaspora::write_secret_file(f), diaspora::Error);
  {
    std::ofstream(dir.path() / "weak") << "tooshort\n";
  }
  try {
    diaspora::load_secret_file(dir.path() / "weak");
    FAIL();
  } catch (const TokenError& e) {
    EXPECT_EQ(e.code(), TokenErrc::bad_secret);
  }
  EXPECT_THROW(diaspora::load_secret_file(dir.path() / "missing"), TokenError);
}

TEST(Token, TtlParsing) {
  EXPECT_EQ(diaspora::parse_ttl("90s"), 90s);
  EXPECT_EQ(diaspora::parse_ttl("15m"), 15min);
  EXPECT_EQ(diaspora::parse_ttl("7d"), std::chrono::seconds(7 * 86400));
  EXPECT_EQ(diaspora::parse_ttl("3600"), 1h);
  EXPECT_THROW(diaspora::parse_ttl("1y"), diaspora::Error);
  EXPECT_THROW(diaspora::parse_ttl("-5m"), diaspora::Error);
}

TEST(TokenFile, ReadsTheTokenWithoutItsNewlineAndRefusesMissingOrEmptyFiles) {
  diaspora::test::TempDir dir;
  std::ofstream(dir.path() / "token") << "eyJ.abc.def\r\n";
  EXPECT_EQ(diaspora::load_token_file(dir.path() / "token"), "eyJ.abc.def");
  std::ofstream(dir.path() / "empty") << "\n";
  EXPECT_THROW(diaspora::load_token_file(dir.path() / "empty"), diaspora::Error);
  try {
    diaspora::load_token_file(dir.path() / "missing");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const diaspora::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// A signed token whose payload is `payload` as written (what a token holder could forge
// with the secret, or an issuer with a bug could write).
static std::string signed_with_payload(const std::string& payload) {
  const std::string head = b64url(R"({"alg":"HS256","typ":"JWT"})") + "." + b64url(payload);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), kSecret.data(), static_cast<int>(kSecret.size()), reinterpret_cast<const unsigned char*>(head.data()),
       head.size(), mac, &len);
  return head + "." + b64url(std::string(reinterpret_cast<const char*>(mac), len));
}

// Found by tests/fuzz/fuzz_token.cpp: a time claim beyond int64 escaped verify() as a
// boost::system::system_error (not a TokenError: the relay's hello did not catch it), and
// one near the end of int64 overflowed the expiry check.
TEST(Token, TimeClaimsOutOfRangeAreMalformed) {
  diaspora::TokenVerifier v(kSecret);
  for (const char* bad : {R"({"sub":"u","exp":1900000000,"iat":9223372036854775808})",
                          R"({"sub":"u","exp":1e300})", R"({"sub":"u","exp":9223372036854775807})",
                          R"({"sub":"u","exp":-5})", R"({"sub":"u","exp":1900000000,"nbf":17000000000})", R"({"sub":"u","exp":9214646400})",
                          R"({"sub":"u","exp":1900000000,"nbf":1e999})"})
    EXPECT_EQ(refusal(v, signed_with_payload(bad)), TokenErrc::malformed) << bad;
  // The end of 2261 (the clock's range, as for events' times) and a whole number written as
  // a double are times.
  EXPECT_EQ(v.verify(signed_with_payload(R"({"sub":"u","exp":9214646399})"), t0()).expires_at.time_since_epoch().count(),
            9214646399);
  EXPECT_EQ(v.verify(signed_with_payload(R"({"sub":"u","exp":1.9e9})"), t0()).expires_at.time_since_epoch().count(),
            1900000000);
}
