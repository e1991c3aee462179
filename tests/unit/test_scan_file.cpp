// The scan file (diaspora/scan_file.hpp): what ptycho-reconstruct writes and the trainer's
// ptycho-stream reads. A round trip keeps every value; every kind of bad file is refused
// with its name and what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "diaspora/crc32c.hpp"
#include "diaspora/error.hpp"
#include "diaspora/scan_file.hpp"

namespace {

using diaspora::ScanFile;

ScanFile small_scan() {
  ScanFile s;
  s.object_size = 12;
  s.patch = 8;
  s.positions = {{0, 0}, {0, 4}, {4, 0}, {4, 4}};
  for (std::size_t i = 0; i < 4 * 64; ++i) s.diffraction.push_back(static_cast<float>(i) * 0.5f);
  for (std::size_t i = 0; i < 64; ++i) s.probe_intensity.push_back(1.0f + static_cast<float>(i));
  for (std::size_t i = 0; i < 144; ++i) s.object.emplace_back(static_cast<float>(i), -static_cast<float>(i) / 3);
  return s;
}

// Re-stamps the trailing checksum after an edit, so that the check under test is the one hit.
void restamp(std::string& bytes) {
  const std::uint32_t crc = diaspora::crc32c(bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
}

std::string decode_error(const std::string& bytes) {
  try {
    diaspora::decode_scan(bytes, "s.scan");
  } catch (const diaspora::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ScanFile, RoundTripKeepsEveryValue) {
  const ScanFile s = small_scan();
  const std::string bytes = diaspora::encode_scan(s);
  EXPECT_EQ(bytes.size(), 24u + 4 * 8 + 4 * 64 * 4 + 64 * 4 + 144 * 8 + 4);
  const ScanFile d = diaspora::decode_scan(bytes, "s.scan");
  EXPECT_EQ(d.object_size, 12u);
  EXPECT_EQ(d.patch, 8u);
  EXPECT_EQ(d.positions, s.positions);
  EXPECT_EQ(d.diffraction, s.diffraction);
  EXPECT_EQ(d.probe_intensity, s.probe_intensity);
  EXPECT_EQ(d.object, s.object);
}

TEST(ScanFile, BadFilesAreRefusedWithTheReason) {
  const std::string good = diaspora::encode_scan(small_scan());
  EXPECT_NE(decode_error("hello").find("s.scan: not a Diaspora scan file"), std::string::npos);
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(decode_error(magic).find("not a Diaspora scan file"), std::string::npos);
  EXPECT_NE(decode_error(good.substr(0, good.size() - 9)).find("a truncated or overwritten file?"), std::string::npos);
  std::string flipped = good;
  flipped[200] ^= 1;
  EXPECT_NE(decode_error(flipped).find("checksum mismatch"), std::string::npos);
  std::string corner = good;
  const std::int32_t far = 9;  // 9 + 8 > 12: the patch leaves the object
  std::memcpy(corner.data() + 24, &far, 4);
  restamp(corner);
  EXPECT_NE(decode_error(corner).find("position 0 (9, 0) puts the patch outside the object"), std::string::npos);
  std::string nan = good;
  const float bad = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + 24 + 32 + 4, &bad, 4);
  restamp(nan);
  EXPECT_NE(decode_error(nan).find("a diffraction value is not finite"), std::string::npos);
  std::string huge = good;
  const std::uint32_t big = 100000;
  std::memcpy(huge.data() + 8, &big, 4);
  EXPECT_NE(decode_error(huge).find("object size 100000 is outside 1..8192"), std::string::npos);
}

TEST(ScanFile, EncodeRefusesInconsistentArrays) {
  ScanFile s = small_scan();
  s.diffraction.pop_back();
  EXPECT_THROW(diaspora::encode_scan(s), diaspora::Error);
  s = small_scan();
  s.positions[1] = {0, 5};
  EXPECT_THROW(diaspora::encode_scan(s), diaspora::Error);
  s = small_scan();
  s.object[7] = {std::numeric_limits<float>::infinity(), 0};
  EXPECT_THROW(diaspora::encode_scan(s), diaspora::Error);
}

}  // namespace
