// Fuzz target: the scan files diaspora-train's ptycho-stream dataset reads from disk
// (decode_scan, core/include/diaspora/scan_file.hpp). The first byte steers: odd, a small
// scan is built from the input's bytes, encoded, and one byte of it changed where the input
// says; even, the rest is the file's bytes. Invariants: only diaspora::Error escapes; a
// decoded scan encodes to the same bytes; a scan with one byte changed is never accepted.
#include <cstring>

#include "diaspora/error.hpp"
#include "diaspora/scan_file.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  if (in.byte() & 1) {
    ScanFile s;
    s.patch = 1 + in.byte() % 4;
    s.object_size = s.patch + in.byte() % 5;
    const std::size_t p = 1 + in.byte() % 3;
    for (std::size_t i = 0; i < p; ++i)
      s.positions.emplace_back(in.byte() % (s.object_size - s.patch + 1), in.byte() % (s.object_size - s.patch + 1));
    auto value = [&] { return static_cast<float>(in.byte()) / 7.0f; };
    s.diffraction.resize(p * s.patch * s.patch);
    for (float& f : s.diffraction) f = value();
    s.probe_intensity.resize(s.patch * s.patch);
    for (float& f : s.probe_intensity) f = value();
    s.object.resize(s.object_size * s.object_size);
    for (auto& c : s.object) c = {value(), -value()};
    const std::string bytes = encode_scan(s);
    FUZZ_CHECK(encode_scan(decode_scan(bytes, "fuzz.scan")) == bytes);
    std::string damaged = bytes;
    const std::size_t at = (in.byte() << 8 | in.byte()) % damaged.size();
    damaged[at] = static_cast<char>(damaged[at] ^ (in.byte() | 1));
    bool refused = false;
    try {
      (void)decode_scan(damaged, "fuzz.scan");
    } catch (const Error&) {
      refused = true;
    }
    FUZZ_CHECK(refused);
    return 0;
  }
  const std::string bytes(in.rest());
  try {
    const ScanFile s = decode_scan(bytes, "fuzz.scan");
    FUZZ_CHECK(encode_scan(s) == bytes);
  } catch (const Error&) {
  }
  return 0;
}
