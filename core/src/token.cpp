#include "diaspora/token.hpp"
#include "diaspora/files.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include "diaspora/event.hpp"
#include "diaspora/files.hpp"

namespace diaspora {

namespace json = boost::json;

std::string_view to_string(TokenErrc code) noexcept {
  switch (code) {
    case TokenErrc::malformed: return "malformed";
    case TokenErrc::unsupported_algorithm: return "unsupported_algorithm";
    case TokenErrc::bad_signature: return "bad_signature";
    case TokenErrc::expired: return "expired";
    case TokenErrc::not_yet_valid: return "not_yet_valid";
    case TokenErrc::insufficient_scope: return "insufficient_scope";
    case TokenErrc::missing_claim: return "missing_claim";
    case TokenErrc::bad_secret: return "bad_secret";
  }
  return "unknown";
}

namespace {

std::string b64url_encode(std::string_view in) {
  std::string s = base64_encode(in);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (char& c : s) c = c == '+' ? '-' : c == '/' ? '_' : c;
  return s;
}

std::optional<std::string> b64url_decode(std::string_view in) {
  std::string s(in);
  for (char& c : s) {
    if (c == '+' || c == '/' || c == '=') return std::nullopt;  // not base64url
    c = c == '-' ? '+' : c == '_' ? '/' : c;
  }
  if (s.size() % 4 == 1) return std::nullopt;
  while (s.size() % 4) s += '=';
  auto out = base64_decode(s);
  // Refuse non-canonical encodings (nonzero unused bits): one token, one spelling.
  if (out && b64url_encode(*out) != in) return std::nullopt;
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
            data.size(), out, &len))
    throw Error("HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<char*>(out), len);
}

void check_secret(std::string_view secret) {
  if (secret.size() < kMinSecretBytes)
    throw TokenError(TokenErrc::bad_secret, "the signing secret has " + std::to_string(secret.size()) +
                                                " bytes; at least " + std::to_string(kMinSecretBytes) +
                                                " are required (make one with 'diaspora token secret FILE')");
}

[[noreturn]] void refuse(TokenErrc code, const std::string& msg) { throw TokenError(code, msg); }

}  // namespace

std::string load_secret_file(const std::filesystem::path& file) {
  std::string s;
  try {
    s = read_file(file, 1 << 20);
  } catch (const Error&) {
    refuse(TokenErrc::bad_secret, file.string() + ": cannot open the secret file");
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  try {
    check_secret(s);
  } catch (const TokenError& e) {
    refuse(TokenErrc::bad_secret, file.string() + ": " + e.what());
  }
  return s;
}

std::string load_token_file(const std::filesystem::path& file) {
  std::string t = read_file(file, 1 << 20);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  if (t.empty()) throw Error(file.string() + ": the token file is empty");
  return t;
}

void write_secret_file(const std::filesystem::path& file, bool overwrite) {
  if (!overwrite && std::filesystem::exists(file))
    throw Error(file.string() + ": exists; refusing to overwrite a secret (pass --force to replace it)");
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw Error("RAND_bytes failed (OpenSSL)");
  static constexpr char hex[] = "0123456789abcdef";
  std::string text;
  for (unsigned char c : raw) {
    text += hex[c >> 4];
    text += hex[c & 15];
  }
  text += '\n';
  write_file_atomic(file, text, 0600);
}

std::string issue_token(std::string_view secret, const TokenClaims& c) {
  check_secret(secret);
  if (c.subject.empty()) refuse(TokenErrc::missing_claim, "a token needs a subject (sub)");
  json::object header{{"alg", "HS256"}, {"typ", "JWT"}};
  json::object payload;
  payload["sub"] = c.subject;
  json::array scopes;
  for (const auto& s : c.scopes) scopes.emplace_back(s);
  payload["scope"] = std::move(scopes);
  payload["iat"] = c.issued_at.time_since_epoch().count();
  payload["exp"] = c.expires_at.time_since_epoch().count();
  if (c.not_before) payload["nbf"] = c.not_before->time_since_epoch().count();
  if (c.issuer) payload["iss"] = *c.issuer;
  payload["jti"] = c.token_id.empty() ? make_uuid() : c.token_id;
  std::string signing_input = b64url_encode(json::serialize(header)) + "." + b64url_encode(json::serialize(payload));
  return signing_input + "." + b64url_encode(hmac_sha256(secret, signing_input));
}

bool topic_matches(std::string_view pattern, std::string_view topic) noexcept {
  // Iterative glob with backtracking on the last '*'.
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < topic.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && pattern[p] == topic[t]) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool scopes_allow(const std::vector<std::string>& scopes, std::string_view action, std::string_view topic) noexcept {
  for (const auto& s : scopes) {
    if (s == "admin") return true;
    std::string_view sv = s;
    auto colon = sv.find(':');
    if (colon == std::string_view::npos) continue;
    if (sv.substr(0, colon) == action && topic_matches(sv.substr(colon + 1), topic)) return true;
  }
  return false;
}

TokenVerifier::TokenVerifier(std::string secret, std::chrono::seconds leeway)
    : secret_(std::move(secret)), leeway_(leeway) {
  check_secret(secret_);
}

TokenClaims TokenVerifier::verify(std::string_view token) const {
  return verify(token, std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now()));
}

TokenClaims TokenVerifier::verify(std::string_view token, SysSeconds now) const {
  auto dot1 = token.find('.');
  auto dot2 = dot1 == std::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos)
    refuse(TokenErrc::malformed, "token is not a JWT (expected header.payload.signature)");
  auto header_raw = b64url_decode(token.substr(0, dot1));
  auto payload_raw = b64url_decode(token.substr(dot1 + 1, dot2 - dot1 - 1));
  auto sig = b64url_decode(token.substr(dot2 + 1));
  if (!header_raw || !payload_raw || !sig) refuse(TokenErrc::malformed, "token parts are not base64url");
  boost::system::error_code ec;
  json::value header = json::parse(*header_raw, ec);
  if (ec || !header.is_object()) refuse(TokenErrc::malformed, "token header is not a JSON object");
  const json::value* alg = header.get_object().if_contains("alg");
  if (!alg || !alg->is_string()) refuse(TokenErrc::malformed, "token header has no 'alg'");
  if (alg->get_string() != "HS256")
    refuse(TokenErrc::unsupported_algorithm,
           "token algorithm '" + std::string(alg->get_string()) + "' is not accepted; only HS256 is");
  std::string expected = hmac_sha256(secret_, token.substr(0, dot2));
  if (sig->size() != expected.size() || CRYPTO_memcmp(sig->data(), expected.data(), expected.size()) != 0)
    refuse(TokenErrc::bad_signature, "token signature does not verify (tampered, or signed with another secret)");
  json::value payload = json::parse(*payload_raw, ec);
  if (ec || !payload.is_object()) refuse(TokenErrc::malformed, "token payload is not a JSON object");
  const json::object& p = payload.get_object();
  TokenClaims c;
  c.payload_json = std::move(*payload_raw);
  auto num = [&](std::string_view k) -> std::optional<SysSeconds> {
    const json::value* v = p.if_contains(k);
    if (!v) return std::nullopt;
    if (!v->is_number()) refuse(TokenErrc::malformed, "claim '" + std::string(k) + "' is not a number");
    // Seconds since 1970 up to the end of 2261, the system clock's range (nanoseconds in 64
    // bits; events' times have the same): a number beyond it (2^63, 1e300, year 2508) is no
    // time and would overflow the checks below (found by tests/fuzz/fuzz_token.cpp).
    constexpr double kLast = 9214646399.0;  // 2261-12-31T23:59:59Z
    boost::system::error_code nec;
    const double d = v->to_number<double>(nec);
    if (nec || !(d >= 0 && d <= kLast))
      refuse(TokenErrc::malformed, "claim '" + std::string(k) + "' is not a time between 1970 and 2261 (seconds)");
    return SysSeconds(std::chrono::seconds(static_cast<std::int64_t>(d)));
  };
  const json::value* sub = p.if_contains("sub");
  if (!sub || !sub->is_string() || sub->get_string().empty()) refuse(TokenErrc::missing_claim, "token has no subject (sub)");
  c.subject = std::string(sub->get_string());
  auto exp = num("exp");
  if (!exp) refuse(TokenErrc::missing_claim, "token has no expiry (exp); Diaspora refuses tokens that never expire");
  c.expires_at = *exp;
  c.issued_at = num("iat").value_or(SysSeconds{});
  c.not_before = num("nbf");
  if (const json::value* v = p.if_contains("iss"); v && v->is_string()) c.issuer = std::string(v->get_string());
  if (const json::value* v = p.if_contains("jti"); v && v->is_string()) c.token_id = std::string(v->get_string());
  if (const json::value* v = p.if_contains("scope")) {
    // An array of strings, or a space-separated string (RFC 8693 style).
    if (v->is_array()) {
      for (const auto& s : v->get_array())
        if (s.is_string()) c.scopes.emplace_back(s.get_string());
    } else if (v->is_string()) {
      std::string_view all = v->get_string();
      while (!all.empty()) {
        auto sp = all.find(' ');
        if (sp != 0) c.scopes.emplace_back(all.substr(0, sp));
        all = sp == std::string_view::npos ? std::string_view{} : all.substr(sp + 1);
      }
    } else {
      refuse(TokenErrc::malformed, "claim 'scope' must be an array of strings or a string");
    }
  }
  if (now >= c.expires_at + leeway_)
    refuse(TokenErrc::expired, "token expired at " + format_rfc3339(c.expires_at) + "; issue a new one");
  if (c.not_before && now + leeway_ < *c.not_before)
    refuse(TokenErrc::not_yet_valid, "token is not valid before " + format_rfc3339(*c.not_before));
  return c;
}

TokenClaims TokenVerifier::authorize(std::string_view token, std::string_view action, std::string_view topic) const {
  TokenClaims c = verify(token);
  if (!scopes_allow(c.scopes, action, topic))
    refuse(TokenErrc::insufficient_scope, "token of '" + c.subject + "' does not grant " + std::string(action) + " on '" +
                                              std::string(topic) + "' (needs scope '" + std::string(action) + ":" +
                                              std::string(topic) + "' or a matching pattern)");
  return c;
}

std::chrono::seconds parse_ttl(std::string_view text) {
  if (text.empty()) throw Error("empty TTL; use e.g. 90s, 15m, 1h or 7d");
  std::int64_t n = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || n <= 0) throw Error("bad TTL '" + std::string(text) + "'; use e.g. 90s, 15m, 1h or 7d");
  std::string_view unit(ptr, text.data() + text.size() - ptr);
  std::int64_t mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 0;
  if (mult == 0) throw Error("bad TTL unit '" + std::string(unit) + "'; use s, m, h or d");
  return std::chrono::seconds(n * mult);
}

}  // namespace diaspora
