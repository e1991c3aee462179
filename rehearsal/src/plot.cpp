// PNG line-chart writer on core's Raster (diaspora/raster.hpp). See plot.hpp for the contract.
#include "plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "diaspora/files.hpp"
#include "diaspora/raster.hpp"

namespace diaspora::rehearsal {
namespace {

namespace fs = std::filesystem;

using diaspora::Rgb;
using Canvas = diaspora::Raster;
int text_width(std::string_view s, int scale) { return Canvas::text_width(s, scale); }
constexpr Rgb kBlack{0, 0, 0}, kAxis{70, 70, 70}, kGrid{228, 228, 228};

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

}  // namespace

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
  write_file_atomic(file, c.png());
}

}  // namespace diaspora::rehearsal
