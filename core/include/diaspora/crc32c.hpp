// CRC32C (Castagnoli), the checksum of every stored record (diaspora/storage.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace diaspora {

/// CRC32C of `size` bytes at `data`, hardware-accelerated when the CPU has SSE4.2 (checked
/// at run time). Pass a previous result as `crc` to continue it:
/// crc32c(b, nb, crc32c(a, na)) == crc32c(a + b). Pure function: any thread; never throws.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept;

namespace detail {
/// The table-driven fallback of crc32c(), exposed so tests cover it on SSE4.2 machines too.
std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept;
}  // namespace detail

}  // namespace diaspora
