// A small raster for charts written as PNG (standard library + zlib): rectangles, lines,
// discs and text in a hand-drawn 5x7 bitmap font (ASCII digits, letters, space and
// `.,-_()/:%+=`; anything else is drawn as a box). Used by diaspora-train's curves.png and
// diaspora run's timeline.png.
//
// Thread safety: a Raster is a plain value (one thread at a time); the functions are reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace diaspora {

struct Rgb {
  std::uint8_t r, g, b;
};

/// An RGB8 image, white to start with. Drawing outside it is clipped.
class Raster {
 public:
  /// A cell of text is 6 x 9 units (5 columns + 1 space, 7 rows + 2 descender rows), each
  /// unit `scale` pixels.
  static constexpr int kCellW = 6, kCellH = 9;

  /// Throws std::invalid_argument unless 1 <= width, height <= 16384.
  Raster(int width, int height);
  int width() const noexcept { return w_; }
  int height() const noexcept { return h_; }
  void set(int x, int y, Rgb c) noexcept;
  void fill_rect(int x, int y, int w, int h, Rgb c) noexcept;
  /// A line `thick` pixels wide (Bresenham, a thick x thick square at every step).
  void line(int x0, int y0, int x1, int y1, Rgb c, int thick = 1) noexcept;
  void disc(int cx, int cy, int r, Rgb c) noexcept;
  /// Text with its top-left corner at (x, y).
  void text(int x, int y, std::string_view s, int scale, Rgb c) noexcept;
  /// Width in pixels of `s` drawn at `scale`.
  static int text_width(std::string_view s, int scale) noexcept;
  const std::vector<std::uint8_t>& pixels() const noexcept { return px_; }
  /// The image as PNG bytes (encode_png_rgb).
  std::string png() const;

 private:
  int w_, h_;
  std::vector<std::uint8_t> px_;
};

/// Encodes RGB8 pixels (row-major, 3 bytes per pixel, no padding) as PNG bytes: signature,
/// IHDR (bit depth 8, colour type 2, no interlace), a single IDAT holding every scanline with
/// filter type 0 compressed by zlib's compress2, and IEND; chunk CRCs by zlib's crc32.
///
/// Errors: std::invalid_argument when width or height is not positive or rgb.size() !=
/// width * height * 3, or the compressed data would not fit one PNG chunk (>= 2^31 bytes);
/// std::runtime_error when zlib fails (e.g. out of memory).
std::string encode_png_rgb(const std::vector<std::uint8_t>& rgb, int width, int height);

}  // namespace diaspora
