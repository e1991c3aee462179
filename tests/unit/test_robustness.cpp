// Mutation tests for the parsers that read outside input (events, specs, tokens): random
// byte flips, truncations and splices of the corpus files. Every outcome must be a value
// or the documented exception — never a crash, a hang or another exception type. Run
// under `make test-asan` this is a small fuzzer with a fixed seed (reproducible).
#include <random>

#include "diaspora/event.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/token.hpp"
#include "test_helpers.hpp"

namespace {

std::string mutate(std::string s, std::mt19937& rng) {
  std::uniform_int_distribution<int> op(0, 4);
  auto pos = [&] { return s.empty() ? 0 : std::uniform_int_distribution<std::size_t>(0, s.size() - 1)(rng); };
  static const std::string interesting[] = {"\"", "{", "}", "[", "]", ":", ",", "\\u0000", "-", "\n  ", "\t",
                                            "&a", "*a", "!!int ", "? ", "--- ", "1e999", "null", "\xff\xfe", "'"};
  int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    switch (op(rng)) {
      case 0: if (!s.empty()) s[pos()] = static_cast<char>(rng()); break;
      case 1: if (!s.empty()) s.erase(pos(), 1 + rng() % 8); break;
      case 2: s.insert(pos(), interesting[rng() % std::size(interesting)]); break;
      case 3: s.resize(pos()); break;
      case 4: { std::size_t p = pos(); s.insert(p, s.substr(pos(), rng() % 32)); break; }
    }
  }
  return s;
}

template <class Fn>
void for_mutations(const std::vector<std::filesystem::path>& files, int per_file, Fn fn) {
  std::mt19937 rng(20261130);
  for (const auto& f : files) {
    std::string original = diaspora::test::read_file(f);
    for (int i = 0; i < per_file; ++i) fn(mutate(original, rng));
  }
}

}  // namespace

TEST(Robustness, EventDecoderOnlyThrowsEventError) {
  auto files = diaspora::test::files_in(diaspora::test::source_dir() / "tests/data/events/valid", ".json");
  int accepted = 0, refused = 0;
  for_mutations(files, 200, [&](const std::string& text) {
    try {
      diaspora::Event e = diaspora::decode_event(text);
      // Whatever is accepted must encode and decode to the same event.
      EXPECT_EQ(diaspora::decode_event(diaspora::encode_event(e)), e);
      ++accepted;
    } catch (const diaspora::EventError&) {
      ++refused;
    }
  });
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);
}

TEST(Robustness, SpecLoaderNeverThrowsAndAlwaysLocatesErrors) {
  auto files = diaspora::test::files_in(diaspora::test::source_dir() / "tests/data/specs/good", ".yaml");
  int bad = 0;
  for_mutations(files, 60, [&](const std::string& text) {
    diaspora::SpecLoadResult r = diaspora::load_spec_string(text, "m.yaml");
    if (!r.ok()) {
      ++bad;
      ASSERT_FALSE(r.diagnostics.empty());
      for (const auto& d : r.diagnostics) {
        EXPECT_GE(d.line, 1) << d.str();
        EXPECT_GE(d.column, 1) << d.str();
        EXPECT_FALSE(d.message.empty());
      }
    }
  });
  EXPECT_GT(bad, 0);
}

TEST(Robustness, TokenVerifierOnlyThrowsTokenError) {
  const std::string secret(40, 'k');
  diaspora::TokenClaims c;
  c.subject = "s";
  c.scopes = {"admin"};
  c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  c.expires_at = c.issued_at + std::chrono::hours(1);
  std::string tok = diaspora::issue_token(secret, c);
  diaspora::TokenVerifier v(secret);
  std::mt19937 rng(7);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string m = mutate(tok, rng);
    try {
      v.verify(m);
      EXPECT_EQ(m, tok) << "a modified token was accepted";
    } catch (const diaspora::TokenError&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 2900);
}
