// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of the storage layer's
// framed records. SSE4.2's crc32 instruction when the CPU has it (checked at run time, so
// the binary still runs on older or non-x86 CPUs), else slicing-by-8 tables.
#include <bit>
#include <cstdint>
#include <cstring>

#include "diaspora/crc32c.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define DIASPORA_CRC32C_X86 1
#endif

namespace diaspora {

namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;

struct Tables {
  std::uint32_t t[8][256];
};

// t[0] is the classic byte table; t[k][i] is the CRC of byte i followed by k zero bytes,
// which lets the loop below fold 8 input bytes per step with independent lookups.
constexpr Tables make_tables() {
  Tables tb{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
    tb.t[0][i] = c;
  }
  for (int s = 1; s < 8; ++s)
    for (std::uint32_t i = 0; i < 256; ++i) tb.t[s][i] = (tb.t[s - 1][i] >> 8) ^ tb.t[0][tb.t[s - 1][i] & 0xffu];
  return tb;
}

constexpr Tables kTables = make_tables();

// Works on the raw register value (pre-inverted), like the hardware instruction.
std::uint32_t crc_sw(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  const auto& t = kTables.t;
  if constexpr (std::endian::native == std::endian::little) {
    while (n >= 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      const std::uint32_t lo = static_cast<std::uint32_t>(w) ^ c;
      const std::uint32_t hi = static_cast<std::uint32_t>(w >> 32);
      c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
      p += 8;
      n -= 8;
    }
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
  return c;
}

#ifdef DIASPORA_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t crc_hw(const unsigned char* p, std::size_t n,
                                                        std::uint32_t c) noexcept {
#if defined(__x86_64__)
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
#endif
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool have_sse42() noexcept {
  // __builtin_cpu_init must run before __builtin_cpu_supports when called this early
  // (e.g. from a static initializer); it is idempotent.
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
#ifdef DIASPORA_CRC32C_X86
  static const bool hw = have_sse42();
  if (hw) return ~crc_hw(p, size, ~crc);
#endif
  return ~crc_sw(p, size, ~crc);
}

namespace detail {
std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc) noexcept {
  return ~crc_sw(static_cast<const unsigned char*>(data), size, ~crc);
}
}  // namespace detail

}  // namespace diaspora
