// PNG encoder (signature, IHDR, chunk CRCs, IDAT round trip) and the matrix line chart
// (decodable file, several colours, atomic write, argument and I/O errors).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "diaspora/raster.hpp"
#include "plot.hpp"

namespace dr = diaspora::rehearsal;
namespace fs = std::filesystem;

namespace {

struct Decoded {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
};

std::uint32_t be32(const std::string& s, std::size_t at) {
  return std::uint32_t(std::uint8_t(s[at])) << 24 | std::uint32_t(std::uint8_t(s[at + 1])) << 16 |
         std::uint32_t(std::uint8_t(s[at + 2])) << 8 | std::uint32_t(std::uint8_t(s[at + 3]));
}

// Strict decoder for what encode_png_rgb promises: IHDR, exactly one IDAT, IEND; CRCs checked.
void decode(const std::string& png, Decoded* out) {
  static const std::string kSig("\x89PNG\r\n\x1a\n", 8);
  ASSERT_GE(png.size(), 8u);
  ASSERT_EQ(png.substr(0, 8), kSig);
  std::vector<std::string> types;
  std::string idat;
  std::size_t at = 8;
  while (at < png.size()) {
    ASSERT_LE(at + 12, png.size());
    const std::uint32_t len = be32(png, at);
    ASSERT_LE(at + 12 + len, png.size());
    const std::string type = png.substr(at + 4, 4);
    const std::string data = png.substr(at + 8, len);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(png.data() + at + 4), uInt(len + 4));
    EXPECT_EQ(be32(png, at + 8 + len), std::uint32_t(crc)) << "bad CRC in chunk " << type;
    if (types.empty()) {
      ASSERT_EQ(type, "IHDR");
      ASSERT_EQ(len, 13u);
      out->width = int(be32(data, 0));
      out->height = int(be32(data, 4));
      EXPECT_EQ(data[8], 8) << "bit depth";
      EXPECT_EQ(data[9], 2) << "colour type";
      EXPECT_EQ(data[10], 0);
      EXPECT_EQ(data[11], 0);
      EXPECT_EQ(data[12], 0);
    }
    if (type == "IDAT") idat += data;
    types.push_back(type);
    at += 12 + len;
  }
  ASSERT_EQ(at, png.size());
  ASSERT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  ASSERT_GT(out->width, 0);
  ASSERT_GT(out->height, 0);
  const std::size_t row = std::size_t(out->width) * 3;
  const std::size_t expected = std::size_t(out->height) * (1 + row);
  std::vector<std::uint8_t> raw(expected + 1);
  uLongf raw_len = uLongf(raw.size());
  ASSERT_EQ(uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), uLong(idat.size())), Z_OK);
  ASSERT_EQ(raw_len, expected);
  out->rgb.clear();
  for (int y = 0; y < out->height; ++y) {
    const std::uint8_t* line = raw.data() + std::size_t(y) * (1 + row);
    ASSERT_EQ(line[0], 0) << "filter type of scanline " << y;
    out->rgb.insert(out->rgb.end(), line + 1, line + 1 + row);
  }
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::vector<double>> accuracy_matrix(int t) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> m(std::size_t(t), std::vector<double>(std::size_t(t), nan));
  for (int i = 0; i < t; ++i)
    for (int j = 0; j <= i; ++j) m[std::size_t(i)][std::size_t(j)] = 0.95 - 0.12 * (i - j) + 0.01 * j;
  return m;
}

class PlotFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() /
           ("diaspora_plot_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    return names;
  }
  fs::path dir_;
};

}  // namespace

TEST(RehearsalPlot, EncodeRoundTripsPixels) {
  for (auto [w, h] : {std::pair{1, 1}, std::pair{13, 7}, std::pair{64, 3}}) {
    std::vector<std::uint8_t> rgb(std::size_t(w) * std::size_t(h) * 3);
    std::mt19937 gen(unsigned(w * 100 + h));
    for (auto& b : rgb) b = std::uint8_t(gen());
    const std::string png = diaspora::encode_png_rgb(rgb, w, h);
    Decoded d;
    ASSERT_NO_FATAL_FAILURE(decode(png, &d));
    EXPECT_EQ(d.width, w);
    EXPECT_EQ(d.height, h);
    EXPECT_EQ(d.rgb, rgb);
  }
}

TEST(RehearsalPlot, EncodeDetectsCorruptedCrcInOurChecker) {
  // Guards the checker itself: flipping a data byte must break the IHDR CRC comparison.
  std::string png = diaspora::encode_png_rgb(std::vector<std::uint8_t>(2 * 2 * 3, 7), 2, 2);
  const uLong good = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(png.data() + 12), 17);
  png[16] ^= 1;  // a width byte
  const uLong bad = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(png.data() + 12), 17);
  EXPECT_NE(good, bad);
  EXPECT_EQ(be32(png, 29), std::uint32_t(good));
}

TEST(RehearsalPlot, EncodeRejectsBadArguments) {
  EXPECT_THROW(diaspora::encode_png_rgb(std::vector<std::uint8_t>(11), 2, 2), std::invalid_argument);
  EXPECT_THROW(diaspora::encode_png_rgb(std::vector<std::uint8_t>(13), 2, 2), std::invalid_argument);
  EXPECT_THROW(diaspora::encode_png_rgb({}, 0, 1), std::invalid_argument);
  EXPECT_THROW(diaspora::encode_png_rgb({}, 1, -1), std::invalid_argument);
}

TEST_F(PlotFile, WritesDecodableColourfulChart) {
  const fs::path file = dir_ / "curves.png";
  dr::write_matrix_plot(file, accuracy_matrix(5), "Split MNIST (replay)", "accuracy");
  ASSERT_TRUE(fs::exists(file));
  EXPECT_EQ(entries(), std::vector<std::string>{"curves.png"}) << "a .tmp file was left behind";
  Decoded d;
  ASSERT_NO_FATAL_FAILURE(decode(read_file(file), &d));
  EXPECT_EQ(d.width, 800);
  EXPECT_EQ(d.height, 520);
  std::set<std::tuple<int, int, int>> colours;
  for (std::size_t p = 0; p + 2 < d.rgb.size(); p += 3)
    if (!(d.rgb[p] == 255 && d.rgb[p + 1] == 255 && d.rgb[p + 2] == 255))
      colours.emplace(d.rgb[p], d.rgb[p + 1], d.rgb[p + 2]);
  EXPECT_GE(colours.size(), 6u);
  EXPECT_TRUE(colours.count({0, 0, 0})) << "no black (average line / text)";
}

TEST_F(PlotFile, ReplacesExistingFileAndHonoursSize) {
  const fs::path file = dir_ / "curves.png";
  dr::write_matrix_plot(file, accuracy_matrix(3), "first", "accuracy");
  dr::write_matrix_plot(file, accuracy_matrix(2), "second", "accuracy", 640, 400);
  Decoded d;
  ASSERT_NO_FATAL_FAILURE(decode(read_file(file), &d));
  EXPECT_EQ(d.width, 640);
  EXPECT_EQ(d.height, 400);
  EXPECT_EQ(entries(), std::vector<std::string>{"curves.png"});
}

TEST_F(PlotFile, HandlesEdgeCaseMatrices) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::vector<std::vector<double>>> cases = {
      {{0.5}},                                        // one task
      {{nan, nan}, {nan, nan}},                       // nothing finite
      {{2.5, 0}, {1.5, 3.0}},                         // a loss, not an accuracy
      {{-0.5, 0}, {0.25, inf}},                       // negative and infinite values
      {{1e7, 0}, {2e7, 3e7}},                         // large values
      {{0.9, 7.0}, {nan, 0.8}},                       // upper triangle ignored, NaN gap
      accuracy_matrix(64),                            // the maximum
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const fs::path file = dir_ / ("case" + std::to_string(k) + ".png");
    ASSERT_NO_THROW(dr::write_matrix_plot(file, cases[k], "edge ~case~", "value")) << "case " << k;
    Decoded d;
    ASSERT_NO_FATAL_FAILURE(decode(read_file(file), &d)) << "case " << k;
  }
}

TEST_F(PlotFile, RejectsBadMatrices) {
  const fs::path file = dir_ / "curves.png";
  EXPECT_THROW(dr::write_matrix_plot(file, {}, "t", "y"), std::invalid_argument);
  EXPECT_THROW(dr::write_matrix_plot(file, {{0.5}, {0.5, 0.6}}, "t", "y"), std::invalid_argument);        // ragged
  EXPECT_THROW(dr::write_matrix_plot(file, {{0.5, 0.1, 0.2}, {0.5, 0.6, 0.7}}, "t", "y"), std::invalid_argument);  // 2x3
  EXPECT_THROW(dr::write_matrix_plot(file, accuracy_matrix(65), "t", "y"), std::invalid_argument);
  EXPECT_THROW(dr::write_matrix_plot(file, accuracy_matrix(2), "t", "y", 10, 10), std::invalid_argument);
  EXPECT_TRUE(entries().empty());
}

TEST_F(PlotFile, UnwritablePathThrowsNamingTheFile) {
  const fs::path file = dir_ / "no_such_dir" / "curves.png";
  try {
    dr::write_matrix_plot(file, accuracy_matrix(3), "t", "accuracy");
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "no_such_dir"));
  EXPECT_TRUE(entries().empty());
}
