// A small, fully specified random generator (xoshiro256** seeded by SplitMix64) with an
// unbiased bounded draw, so draws are identical on every rank and every standard
// library (std::uniform_int_distribution is implementation-defined).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace diaspora::rehearsal {

inline std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__extension__ typedef unsigned __int128 u128;  // GCC/Clang; __extension__: no -Wpedantic

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  Rng(std::uint64_t seed, std::uint64_t stream) : Rng(seed ^ mix(stream)) {}

  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, n), n >= 1, without modulo bias (Lemire's multiply-and-reject).
  std::uint64_t below(std::uint64_t n) {
    u128 m = static_cast<u128>(next()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<u128>(next()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  /// The generator's state, for checkpoints; set_state(state()) continues the sequence.
  std::vector<std::uint64_t> state() const { return {s_[0], s_[1], s_[2], s_[3]}; }
  /// @return false (state unchanged) unless `st` has 4 words, not all zero.
  bool set_state(const std::vector<std::uint64_t>& st) {
    if (st.size() != 4 || (st[0] | st[1] | st[2] | st[3]) == 0) return false;
    for (int i = 0; i < 4; ++i) s_[i] = st[static_cast<std::size_t>(i)];
    return true;
  }

  /// Fisher-Yates.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<std::size_t>(below(i))]);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t mix(std::uint64_t x) { return splitmix64(x); }
  std::uint64_t s_[4];
};

}  // namespace diaspora::rehearsal
