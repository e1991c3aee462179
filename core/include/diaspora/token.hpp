// Bearer tokens: JWTs signed with HS256 carrying scopes per topic pattern. The relay
// verifies them on every connection; `diaspora token issue` mints them.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora {

/// Why a token was refused. Stable values (they appear in protocol errors).
enum class TokenErrc {
  malformed = 1,              ///< not three base64url parts of JSON
  unsupported_algorithm = 2,  ///< alg is not HS256 (including "none")
  bad_signature = 3,          ///< signature does not verify with the secret (tampered)
  expired = 4,                ///< now >= exp (+ leeway)
  not_yet_valid = 5,          ///< now < nbf (- leeway)
  insufficient_scope = 6,     ///< valid token whose scopes do not grant the request
  missing_claim = 7,          ///< sub or exp absent
  bad_secret = 8,             ///< the secret file is missing, empty or too short
};

std::string_view to_string(TokenErrc code) noexcept;

class TokenError : public Error {
 public:
  TokenError(TokenErrc code, const std::string& message,
             std::source_location where = std::source_location::current())
      : Error(message, where), code_(code) {}
  TokenErrc code() const noexcept { return code_; }

 private:
  TokenErrc code_;
};

using SysSeconds = std::chrono::sys_seconds;

/// The claims Diaspora reads and writes.
struct TokenClaims {
  std::string subject;              ///< sub: who (a user, a plugin instance, a service)
  std::vector<std::string> scopes;  ///< scope: "publish:task.*", "subscribe:*", "admin"
  SysSeconds issued_at{};           ///< iat
  SysSeconds expires_at{};          ///< exp
  std::optional<SysSeconds> not_before;  ///< nbf
  std::optional<std::string> issuer;     ///< iss
  std::string token_id;                  ///< jti
  std::string payload_json;              ///< verify(): the payload's JSON text exactly as the token carries it
};

/// Minimum secret length in bytes (HS256 keys shorter than the hash are weak).
inline constexpr std::size_t kMinSecretBytes = 32;

/// Reads a shared secret from a file (trailing newline stripped). Throws TokenError
/// (bad_secret) when the file is missing, unreadable or shorter than kMinSecretBytes.
std::string load_secret_file(const std::filesystem::path& file);

/// Reads a bearer token from `file` (what `diaspora token issue` printed), without the
/// trailing newline or spaces. Throws Error naming the file when it cannot be read or
/// holds no token. Thread-safe.
std::string load_token_file(const std::filesystem::path& file);

/// Writes a fresh random secret (64 hex characters) to `file` with mode 0600. Throws
/// Error when the file exists (unless overwrite) or cannot be written.
void write_secret_file(const std::filesystem::path& file, bool overwrite = false);

/// Signs claims with HS256 and returns the compact JWT. Throws TokenError (bad_secret)
/// for a short secret, or (missing_claim) for an empty subject.
std::string issue_token(std::string_view secret, const TokenClaims& claims);

/// True when `pattern` (with '*' matching any run of characters, including dots)
/// matches `topic` in full.
bool topic_matches(std::string_view pattern, std::string_view topic) noexcept;

/// True when the scopes grant `action` ("publish", "subscribe") on `topic`. "admin"
/// grants everything; "publish:*" every topic; "subscribe:task.*" topics starting "task.".
bool scopes_allow(const std::vector<std::string>& scopes, std::string_view action, std::string_view topic) noexcept;

/// Verifies HS256 tokens against one secret.
///
/// @par Thread Safety
/// Immutable after construction: verify() may be called from any number of threads.
class TokenVerifier {
 public:
  /// `leeway` tolerates clock skew on exp and nbf. Throws TokenError (bad_secret).
  explicit TokenVerifier(std::string secret, std::chrono::seconds leeway = std::chrono::seconds(30));

  /// Checks structure, algorithm, signature (constant-time), exp and nbf, and returns
  /// the claims. Throws TokenError with a distinct code for each failure.
  TokenClaims verify(std::string_view token, SysSeconds now) const;
  TokenClaims verify(std::string_view token) const;

  /// verify() plus a scope check; throws TokenError (insufficient_scope) naming the
  /// action and topic that were refused.
  TokenClaims authorize(std::string_view token, std::string_view action, std::string_view topic) const;

 private:
  std::string secret_;
  std::chrono::seconds leeway_;
};

/// Parses "90s", "15m", "1h", "7d" (or a plain number of seconds). Throws Error.
std::chrono::seconds parse_ttl(std::string_view text);

}  // namespace diaspora
