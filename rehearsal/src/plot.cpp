// PNG line-chart writer: a tiny raster canvas, a hand-drawn 5x7 bitmap font and a minimal
// PNG encoder on top of zlib. See plot.hpp for the contract.
#include "plot.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "diaspora/files.hpp"

namespace diaspora::rehearsal {
namespace {

namespace fs = std::filesystem;

struct Rgb {
  std::uint8_t r, g, b;
};
constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kAxis{70, 70, 70}, kGrid{228, 228, 228};

// 5x7 glyphs, one byte per row (top first), bit 4 = leftmost column. Drawn by hand for this file.
using Rows = std::array<std::uint8_t, 7>;
struct Glyph {
  char c;
  Rows rows;
};
constexpr Glyph kFont[] = {
    {' ', {0, 0, 0, 0, 0, 0, 0}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}}, {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}}, {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}}, {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
    {'g', {0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}}, {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, {'p', {0x1E, 0x11, 0x11, 0x11, 0x1E, 0x10, 0x10}},
    {'q', {0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x01}}, {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0x00, 0x00, 0x0F, 0x10, 0x0E, 0x01, 0x1E}}, {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}}, {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}}, {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
    {'y', {0x11, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}}, {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
};
constexpr Rows kBox{0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F};
// A glyph cell is 6x9 units: 5 columns + 1 space, 7 rows + 2 descender rows.
constexpr int kCellW = 6, kCellH = 9;

const Rows& glyph(char c) {
  for (const Glyph& g : kFont)
    if (g.c == c) return g.rows;
  return kBox;
}

// Letters with a descender are drawn two rows lower (their body sits on the x-height rows).
int descender_shift(char c) { return (c == 'g' || c == 'p' || c == 'q' || c == 'y') ? 2 : 0; }

int text_width(std::string_view s, int scale) { return s.empty() ? 0 : int(s.size()) * kCellW * scale - scale; }

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(std::size_t(w) * std::size_t(h) * 3, 255) {}

  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    std::uint8_t* p = &px_[(std::size_t(y) * std::size_t(w_) + std::size_t(x)) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void fill_rect(int x, int y, int w, int h, Rgb c) {
    for (int yy = std::max(y, 0); yy < std::min(y + h, h_); ++yy)
      for (int xx = std::max(x, 0); xx < std::min(x + w, w_); ++xx) set(xx, yy, c);
  }
  // Bresenham, stamping a thick x thick square at every step.
  void line(int x0, int y0, int x1, int y1, Rgb c, int thick) {
    const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    const int off = (thick - 1) / 2;
    for (int err = dx + dy;;) {
      fill_rect(x0 - off, y0 - off, thick, thick, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  void disc(int cx, int cy, int r, Rgb c) {
    for (int dy = -r; dy <= r; ++dy)
      for (int dx = -r; dx <= r; ++dx)
        if (dx * dx + dy * dy <= r * r + r) set(cx + dx, cy + dy, c);
  }
  void text(int x, int y, std::string_view s, int scale, Rgb c) {
    for (char ch : s) {
      const Rows& rows = glyph(ch);
      const int shift = descender_shift(ch);
      for (int r = 0; r < 7; ++r)
        for (int col = 0; col < 5; ++col)
          if (rows[std::size_t(r)] & (0x10 >> col)) fill_rect(x + col * scale, y + (r + shift) * scale, scale, scale, c);
      x += kCellW * scale;
    }
  }
  const std::vector<std::uint8_t>& pixels() const { return px_; }

 private:
  int w_, h_;
  std::vector<std::uint8_t> px_;
};

Rgb task_colour(int j) {
  static constexpr Rgb kPalette[] = {{214, 39, 40},  {31, 100, 210}, {44, 160, 60},  {245, 135, 15},
                                     {145, 60, 190}, {20, 165, 170}, {205, 60, 150}, {140, 95, 45},
                                     {120, 175, 25}, {200, 160, 0},  {20, 40, 120},  {110, 120, 140}};
  constexpr int n = int(sizeof(kPalette) / sizeof(kPalette[0]));
  if (j < n) return kPalette[j];
  // Beyond the palette: golden-ratio hue steps at fixed saturation/value (HSV -> RGB).
  const double h = std::fmod(j * 0.6180339887, 1.0) * 6.0, s = 0.75, v = 0.8;
  const double f = h - std::floor(h), p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  double r = v, g = t, b = p;
  switch (int(h) % 6) {
    case 1: r = q, g = v, b = p; break;
    case 2: r = p, g = v, b = t; break;
    case 3: r = p, g = q, b = v; break;
    case 4: r = t, g = p, b = v; break;
    case 5: r = v, g = p, b = q; break;
    default: break;
  }
  auto u8 = [](double x) { return std::uint8_t(std::lround(x * 255)); };
  return {u8(r), u8(g), u8(b)};
}

// Smallest of {1, 2, 5} x 10^k that is >= raw (raw > 0).
double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

std::string format_tick(double v, double step) {
  const int decimals = std::clamp(int(-std::floor(std::log10(step) + 1e-9)), 0, 9);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(v) < step * 1e-9 ? 0.0 : v);
  return buf;
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(char((v >> shift) & 0xFF));
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  if (data.size() >= 0x80000000u) throw std::invalid_argument("encode_png_rgb: chunk too large for PNG");
  put_u32(out, std::uint32_t(data.size()));
  const std::size_t start = out.size();
  out.append(type, 4);
  out += data;
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(out.data() + start), uInt(out.size() - start));
  put_u32(out, std::uint32_t(crc));
}

}  // namespace

std::string encode_png_rgb(const std::vector<std::uint8_t>& rgb, int width, int height) {
  if (width <= 0 || height <= 0) throw std::invalid_argument("encode_png_rgb: width and height must be positive");
  const std::size_t row = std::size_t(width) * 3;
  if (rgb.size() / row != std::size_t(height) || rgb.size() % row != 0)
    throw std::invalid_argument("encode_png_rgb: rgb.size() != width * height * 3");
  std::string raw;
  raw.reserve(std::size_t(height) * (row + 1));
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');  // filter type 0 (None)
    raw.append(reinterpret_cast<const char*>(rgb.data()) + std::size_t(y) * row, row);
  }
  uLongf zlen = compressBound(uLong(raw.size()));
  std::string z(zlen, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(z.data()), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
                           uLong(raw.size()), Z_DEFAULT_COMPRESSION);
  if (rc != Z_OK) throw std::runtime_error("encode_png_rgb: zlib compress2 failed (code " + std::to_string(rc) + ")");
  z.resize(zlen);

  std::string ihdr;
  put_u32(ihdr, std::uint32_t(width));
  put_u32(ihdr, std::uint32_t(height));
  ihdr += std::string{'\x08', '\x02', '\0', '\0', '\0'};  // depth 8, RGB, deflate, filter 0, no interlace
  std::string out("\x89PNG\r\n\x1a\n", 8);
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", std::string());
  return out;
}

void write_matrix_plot(const fs::path& file, const std::vector<std::vector<double>>& matrix,
                       const std::string& title, const std::string& y_label, int width, int height) {
  const int T = int(matrix.size());
  if (T == 0) throw std::invalid_argument("write_matrix_plot: empty matrix");
  if (T > 64) throw std::invalid_argument("write_matrix_plot: more than 64 tasks");
  for (const auto& r : matrix)
    if (r.size() != matrix.size()) throw std::invalid_argument("write_matrix_plot: matrix is not T x T");
  if (width < 320 || height < 240 || width > 8192 || height > 8192)
    throw std::invalid_argument("write_matrix_plot: image size outside [320, 8192] x [240, 8192]");

  // y range over the drawn (lower-triangular) finite values.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int i = 0; i < T; ++i)
    for (int j = 0; j <= i; ++j)
      if (std::isfinite(matrix[i][j])) lo = std::min(lo, matrix[i][j]), hi = std::max(hi, matrix[i][j]);
  double ymin = 0, ymax = 1;
  if (lo <= hi && (lo < 0 || hi > 1)) {
    ymin = lo < 0 ? lo * 1.1 : 0.0;
    ymax = hi > 0 ? hi * 1.1 : 1.0;
  }
  const double step = nice_step((ymax - ymin) / 8);
  std::vector<double> yticks;
  for (long k = long(std::ceil(ymin / step - 1e-9)); k * step <= ymax + step * 1e-9; ++k) yticks.push_back(k * step);
  int tick_w = 0;
  for (double v : yticks) tick_w = std::max(tick_w, text_width(format_tick(v, step), 1));

  // Layout: title on top, y label above the axis, legend on the right.
  const int top = 46, bottom = height - 42, left = 16 + tick_w;
  const int row_h = 12, rows_per_col = std::max(1, (bottom - top) / row_h);
  const int cols = (T + 1 + rows_per_col - 1) / rows_per_col, col_w = 24 + text_width("average", 1) + 12;
  const int right = width - 14 - cols * col_w;
  if (right - left < 60 || bottom - top < 60)
    throw std::invalid_argument("write_matrix_plot: image too small for the chart and its legend");

  const int pad = 12;
  auto px = [&](int i) {
    return T == 1 ? (left + right) / 2 : left + pad + int(std::lround(double(i) * (right - left - 2 * pad) / (T - 1)));
  };
  auto py = [&](double v) { return bottom - int(std::lround((v - ymin) / (ymax - ymin) * (bottom - top))); };

  Canvas c(width, height);
  for (double v : yticks) {
    const int y = py(v);
    c.line(left + 1, y, right, y, kGrid, 1);
    c.line(left - 4, y, left, y, kAxis, 1);
    const std::string s = format_tick(v, step);
    c.text(left - 6 - text_width(s, 1), y - 3, s, 1, kBlack);
  }
  const double dx = T == 1 ? 1e9 : double(right - left - 2 * pad) / (T - 1);
  const int label_every = std::max(1, int(std::ceil(24.0 / dx)));
  for (int i = 0; i < T; ++i) {
    c.line(px(i), bottom, px(i), bottom + 4, kAxis, 1);
    if (i % label_every != 0) continue;
    const std::string s = std::to_string(i);
    c.text(px(i) - text_width(s, 1) / 2, bottom + 8, s, 1, kBlack);
  }
  c.line(left, top, left, bottom, kAxis, 1);
  c.line(left, bottom, right, bottom, kAxis, 1);
  c.text((left + right - text_width("after task", 1)) / 2, bottom + 22, "after task", 1, kBlack);
  c.text(std::max(2, left - tick_w - 6), top - 16, y_label, 1, kBlack);
  c.text((width - text_width(title, 2)) / 2, 8, title, 2, kBlack);

  // Series: a polyline over the finite points (non-finite ones skipped) with disc markers.
  auto series = [&](const std::vector<double>& vals, int first, Rgb col, int thick, int radius) {
    int px0 = 0, py0 = 0;
    bool have = false;
    for (int i = first; i < T; ++i) {
      if (!std::isfinite(vals[std::size_t(i)])) continue;
      const int x = px(i), y = py(vals[std::size_t(i)]);
      if (have) c.line(px0, py0, x, y, col, thick);
      px0 = x, py0 = y, have = true;
    }
    for (int i = first; i < T; ++i)
      if (std::isfinite(vals[std::size_t(i)])) c.disc(px(i), py(vals[std::size_t(i)]), radius, col);
  };
  std::vector<double> ys(static_cast<std::size_t>(T)), avg(static_cast<std::size_t>(T));
  for (int j = 0; j < T; ++j) {
    for (int i = 0; i < T; ++i) ys[std::size_t(i)] = matrix[i][j];
    series(ys, j, task_colour(j), 2, 3);
  }
  for (int i = 0; i < T; ++i) {
    double sum = 0;
    int n = 0;
    for (int j = 0; j <= i; ++j)
      if (std::isfinite(matrix[i][j])) sum += matrix[i][j], ++n;
    avg[std::size_t(i)] = n ? sum / n : std::numeric_limits<double>::quiet_NaN();
  }
  series(avg, 0, kBlack, 4, 4);

  // Legend.
  for (int k = 0; k <= T; ++k) {
    const int x = right + 12 + (k / rows_per_col) * col_w, y = top + (k % rows_per_col) * row_h + 6;
    const bool is_avg = k == T;
    const Rgb col = is_avg ? kBlack : task_colour(k);
    c.line(x, y, x + 18, y, col, is_avg ? 4 : 2);
    c.disc(x + 9, y, is_avg ? 4 : 3, col);
    c.text(x + 24, y - 3, is_avg ? std::string("average") : "task " + std::to_string(k), 1, kBlack);
  }
  write_file_atomic(file, encode_png_rgb(c.pixels(), width, height));
}

}  // namespace diaspora::rehearsal
