#include "diaspora/scan_file.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "diaspora/crc32c.hpp"
#include "diaspora/error.hpp"
#include "diaspora/files.hpp"

namespace diaspora {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'P', 'S', 'C', 'A', 'N', '1'};
constexpr std::uint32_t kMaxObject = 8192;
constexpr std::uint32_t kMaxPositions = 1000000;
constexpr std::size_t kHeader = 24;

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <class T>
T get(const std::string& in, std::size_t& at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

// Bytes of a file with these sizes, checksum included.
std::uint64_t file_bytes(std::uint64_t s, std::uint64_t n, std::uint64_t p) {
  return kHeader + p * 8 + p * n * n * 4 + n * n * 4 + s * s * 8 + 4;
}

void check_sizes(std::uint32_t s, std::uint32_t n, std::uint64_t p, const std::string& name) {
  if (s == 0 || s > kMaxObject)
    throw Error(name + ": object size " + std::to_string(s) + " is outside 1.." + std::to_string(kMaxObject));
  if (n == 0 || n > s)
    throw Error(name + ": patch " + std::to_string(n) + " is outside 1..object size (" + std::to_string(s) + ")");
  if (p == 0 || p > kMaxPositions)
    throw Error(name + ": " + std::to_string(p) + " positions, outside 1.." + std::to_string(kMaxPositions));
}

void check_corner(std::int32_t r, std::int32_t c, std::uint32_t s, std::uint32_t n, std::size_t k, const std::string& name) {
  const std::int64_t hi = static_cast<std::int64_t>(s) - n;
  if (r < 0 || c < 0 || r > hi || c > hi)
    throw Error(name + ": position " + std::to_string(k) + " (" + std::to_string(r) + ", " + std::to_string(c) +
                ") puts the patch outside the object (corners must be in 0.." + std::to_string(hi) + ")");
}

// Every value of p[0..count) finite, else "NAME: a WHAT value is not finite".
void check_finite(const float* p, std::size_t count, const std::string& name, const char* what) {
  for (std::size_t i = 0; i < count; ++i)
    if (!std::isfinite(p[i])) throw Error(name + ": a " + what + " value is not finite");
}

}  // namespace

std::string encode_scan(const ScanFile& scan) {
  const std::string name = "scan";
  const std::uint32_t s = scan.object_size, n = scan.patch;
  const std::uint64_t p = scan.positions.size();
  check_sizes(s, n, p, name);
  if (scan.diffraction.size() != p * n * n || scan.probe_intensity.size() != std::size_t{n} * n ||
      scan.object.size() != std::size_t{s} * s)
    throw Error("scan: array sizes do not match object_size " + std::to_string(s) + ", patch " + std::to_string(n) +
                " and " + std::to_string(p) + " positions");
  // A diverged reconstruction is refused here, where it is made, not by every reader.
  check_finite(scan.diffraction.data(), scan.diffraction.size(), name, "diffraction");
  check_finite(scan.probe_intensity.data(), scan.probe_intensity.size(), name, "probe intensity");
  // std::complex<float> is an array of two floats (re, im).
  check_finite(reinterpret_cast<const float*>(scan.object.data()), scan.object.size() * 2, name, "object");
  std::string out;
  out.reserve(file_bytes(s, n, p));
  out.append(kMagic, sizeof kMagic);
  put(out, s);
  put(out, n);
  put(out, static_cast<std::uint32_t>(p));
  put(out, std::uint32_t{0});
  for (std::size_t k = 0; k < p; ++k) {
    check_corner(scan.positions[k].first, scan.positions[k].second, s, n, k, name);
    put(out, scan.positions[k].first);
    put(out, scan.positions[k].second);
  }
  for (float v : scan.diffraction) put(out, v);
  for (float v : scan.probe_intensity) put(out, v);
  for (auto v : scan.object) {
    put(out, v.real());
    put(out, v.imag());
  }
  put(out, crc32c(out.data(), out.size()));
  return out;
}

ScanFile decode_scan(const std::string& bytes, const std::string& name) {
  if (bytes.size() < kHeader + 4 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw Error(name + ": not a Diaspora scan file (it does not start with \"DSPSCAN1\")");
  std::size_t at = sizeof kMagic;
  ScanFile scan;
  scan.object_size = get<std::uint32_t>(bytes, at);
  scan.patch = get<std::uint32_t>(bytes, at);
  const std::uint32_t p = get<std::uint32_t>(bytes, at);
  at += 4;  // reserved
  check_sizes(scan.object_size, scan.patch, p, name);
  const std::uint32_t s = scan.object_size, n = scan.patch;
  const std::uint64_t want = file_bytes(s, n, p);
  if (bytes.size() != want)
    throw Error(name + ": " + std::to_string(bytes.size()) + " bytes, but its header (object " + std::to_string(s) +
                ", patch " + std::to_string(n) + ", " + std::to_string(p) + " positions) needs " + std::to_string(want) +
                " (a truncated or overwritten file?)");
  std::uint32_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
  if (crc32c(bytes.data(), bytes.size() - 4) != stored) throw Error(name + ": checksum mismatch (the file is corrupt)");
  scan.positions.resize(p);
  for (std::size_t k = 0; k < p; ++k) {
    const auto r = get<std::int32_t>(bytes, at), c = get<std::int32_t>(bytes, at);
    check_corner(r, c, s, n, k, name);
    scan.positions[k] = {r, c};
  }
  auto floats = [&](std::vector<float>& v, std::size_t count, const char* what) {
    v.resize(count);
    std::memcpy(v.data(), bytes.data() + at, count * 4);
    at += count * 4;
    check_finite(v.data(), count, name, what);
  };
  floats(scan.diffraction, std::size_t{p} * n * n, "diffraction");
  floats(scan.probe_intensity, std::size_t{n} * n, "probe intensity");
  std::vector<float> obj;
  floats(obj, std::size_t{s} * s * 2, "object");
  scan.object.resize(std::size_t{s} * s);
  for (std::size_t i = 0; i < scan.object.size(); ++i) scan.object[i] = {obj[2 * i], obj[2 * i + 1]};
  return scan;
}

ScanFile read_scan_file(const std::filesystem::path& file) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) throw Error(file.string() + ": cannot read the scan file: " + ec.message());
  if (size > (std::uintmax_t{1} << 30)) throw Error(file.string() + ": " + std::to_string(size) + " bytes, over the 1 GiB limit of a scan file");
  return decode_scan(read_file(file), file.string());
}

}  // namespace diaspora
