// Fuzz target: the bearer tokens the relay reads (TokenVerifier::verify: HS256 JWTs) and the
// scope checks under them. The first byte steers: odd, the rest is "HEADER\n--\nPAYLOAD"
// (JSON texts) signed here with the verifier's secret, so that the fuzzer reaches the claims
// behind the signature check; even, the rest is the token as a client would send it.
// Invariants: only the documented TokenError escapes; a verified token has a subject and is
// not expired at the time it was checked against; its claims issued again verify the same.
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "diaspora/token.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;

namespace {

const std::string kSecret(40, 's');
const SysSeconds kNow{std::chrono::seconds(1'800'000'000)};

std::string b64url(std::string_view in) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += a[(v >> s) & 63];
  }
  if (const std::size_t left = in.size() - i) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (left == 2) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += a[(v >> 18) & 63];
    out += a[(v >> 12) & 63];
    if (left == 2) out += a[(v >> 6) & 63];
  }
  return out;
}

std::string signed_token(std::string_view header, std::string_view payload) {
  std::string head = b64url(header) + "." + b64url(payload);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), kSecret.data(), static_cast<int>(kSecret.size()), reinterpret_cast<const unsigned char*>(head.data()),
       head.size(), mac, &len);
  return head + "." + b64url(std::string_view(reinterpret_cast<const char*>(mac), len));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const TokenVerifier verifier(kSecret);
  fuzz::Input in(data, size);
  std::string token;
  if (in.byte() & 1) {
    const std::string_view header = in.part();
    token = signed_token(header, in.rest());
  } else {
    token = std::string(in.rest());
  }
  std::optional<TokenClaims> claims;
  try {
    claims = verifier.verify(token, kNow);
  } catch (const TokenError& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
  }
  if (!claims) return 0;
  FUZZ_CHECK(!claims->subject.empty());
  FUZZ_CHECK(kNow < claims->expires_at + std::chrono::seconds(30));
  for (const auto& scope : claims->scopes) {
    (void)scopes_allow(claims->scopes, "publish", scope);
    (void)topic_matches(scope, claims->subject);
  }
  const TokenClaims again = verifier.verify(issue_token(kSecret, *claims), kNow);
  FUZZ_CHECK(again.subject == claims->subject && again.scopes == claims->scopes &&
             again.expires_at == claims->expires_at && again.not_before == claims->not_before);
  return 0;
}
