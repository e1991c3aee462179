// The scan file: one reconstructed ptychography scan as `diaspora run`'s
// ptycho-reconstruct task writes it and diaspora-train's `ptycho-stream` dataset reads it
// (docs/run.md, "Scan files"). Little-endian, no padding:
//
//   offset 0   char[8]   "DSPSCAN1"
//          8   u32       object_size  S (the object is S x S)
//         12   u32       patch        n (probe and diffraction patterns are n x n)
//         16   u32       positions    P
//         20   u32       reserved, 0
//         24   i32[P][2]            (row, col) of each patch's top-left corner, in [0, S-n]
//              f32[P][n][n]         sqrt(photon counts) of each pattern (unshifted DFT order)
//              f32[n][n]            the reconstructed probe's intensity (sum over its modes of |p|^2)
//              f32[S][S][2]         the reconstructed object, complex (re, im), row-major
//         end  u32       CRC-32C of every byte before it
#pragma once

#include <complex>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace diaspora {

/// One scan and its reconstruction, in memory.
struct ScanFile {
  std::uint32_t object_size = 0;                 ///< S
  std::uint32_t patch = 0;                       ///< n
  std::vector<std::pair<std::int32_t, std::int32_t>> positions;  ///< P corners (row, col)
  std::vector<float> diffraction;                ///< P * n * n, sqrt(counts)
  std::vector<float> probe_intensity;            ///< n * n
  std::vector<std::complex<float>> object;       ///< S * S
};

/// Encodes `scan` in the layout above. Pure: any thread.
/// @throws diaspora::Error if the sizes of its arrays do not match S, n and P, a corner is
///         outside [0, S-n], S, n or P is 0 or above the reader's limits, or a value is
///         not finite.
std::string encode_scan(const ScanFile& scan);

/// Decodes a scan file's bytes; `name` names it in messages. Pure: any thread.
/// @throws diaspora::Error "NAME: ...": not a scan file (magic), a size beyond the limits
///         (S <= 8192, n <= S, P <= 1,000,000), a length that does not match the header,
///         a bad checksum, a corner outside the object, or a value that is not finite.
ScanFile decode_scan(const std::string& bytes, const std::string& name);

/// Reads and decodes `file` (at most 1 GiB). @throws diaspora::Error naming the file.
ScanFile read_scan_file(const std::filesystem::path& file);

}  // namespace diaspora
