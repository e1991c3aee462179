// ptycho-reconstruct: one simulated ptychographic scan and its reconstruction with
// (mixed-state) ePIE (Maiden & Rodenburg 2009; Thibault & Menzel 2013 for probe modes).
//
// Simulation: a complex object (smooth random amplitude and phase), a Gaussian probe with
// a phase curvature (and weaker higher modes), a raster of scan positions with a little
// jitter; each diffraction pattern is sum_k |FFT(P_k * O_patch)|^2 scaled to `photons`
// counts and drawn from a Poisson distribution. Reconstruction: starting from a flat object
// and a Gaussian probe guess, each iteration visits every position in random order and
// projects the exit waves onto the measured moduli, then updates object and probes.
#include <boost/json/serialize.hpp>

#include <cmath>
#include <complex>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "diaspora/crc32c.hpp"
#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "diaspora/scan_file.hpp"
#include "kinds.hpp"
#include "worker.hpp"

namespace diaspora::runner {

namespace json = boost::json;

namespace {

using cf = std::complex<double>;
using Clock = std::chrono::steady_clock;

// In-place 2-D FFT of an n x n array (n a power of two), iterative radix-2.
class Fft2 {
 public:
  explicit Fft2(int n) : n_(n), rev_(static_cast<std::size_t>(n)), tw_(static_cast<std::size_t>(n / 2)), line_(static_cast<std::size_t>(n)) {
    int bits = 0;
    while ((1 << bits) < n) ++bits;
    for (int i = 0; i < n; ++i) {
      int r = 0;
      for (int b = 0; b < bits; ++b)
        if (i & (1 << b)) r |= 1 << (bits - 1 - b);
      rev_[static_cast<std::size_t>(i)] = r;
    }
    for (int i = 0; i < n / 2; ++i) tw_[static_cast<std::size_t>(i)] = std::polar(1.0, -2 * M_PI * i / n);
  }
  void forward(std::vector<cf>& a) { transform(a, false); }
  void inverse(std::vector<cf>& a) { transform(a, true); }

 private:
  void fft1(cf* x, std::size_t stride, bool inv) {
    const std::size_t n = static_cast<std::size_t>(n_);
    for (std::size_t i = 0; i < n; ++i) line_[static_cast<std::size_t>(rev_[i])] = x[i * stride];
    for (std::size_t len = 2; len <= n; len <<= 1) {
      const std::size_t half = len / 2, step = n / len;
      for (std::size_t i = 0; i < n; i += len)
        for (std::size_t j = 0; j < half; ++j) {
          cf w = tw_[j * step];
          if (inv) w = std::conj(w);
          const cf u = line_[i + j], v = line_[i + j + half] * w;
          line_[i + j] = u + v;
          line_[i + j + half] = u - v;
        }
    }
    const double scale = inv ? 1.0 / static_cast<double>(n) : 1.0;
    for (std::size_t i = 0; i < n; ++i) x[i * stride] = line_[i] * scale;
  }
  void transform(std::vector<cf>& a, bool inv) {
    const std::size_t n = static_cast<std::size_t>(n_);
    for (std::size_t r = 0; r < n; ++r) fft1(&a[r * n], 1, inv);
    for (std::size_t c = 0; c < n; ++c) fft1(&a[c], n, inv);
  }
  int n_;
  std::vector<int> rev_;
  std::vector<cf> tw_, line_;
};

// A smooth random field in [0, 1]: a sum of Gaussian blobs.
std::vector<double> blobs(int n, std::mt19937_64& rng, int count) {
  std::vector<double> f(static_cast<std::size_t>(n) * n, 0.0);
  std::uniform_real_distribution<double> pos(0, n), width(n / 16.0, n / 6.0), amp(0.3, 1.0);
  for (int b = 0; b < count; ++b) {
    const double cx = pos(rng), cy = pos(rng), w = width(rng), a = amp(rng);
    for (int y = 0; y < n; ++y)
      for (int x = 0; x < n; ++x)
        f[static_cast<std::size_t>(y) * n + x] += a * std::exp(-((x - cx) * (x - cx) + (y - cy) * (y - cy)) / (2 * w * w));
  }
  const double mx = *std::max_element(f.begin(), f.end());
  for (auto& v : f) v /= mx > 0 ? mx : 1;
  return f;
}

// Probe mode k of an m x m probe: a Gaussian (sigma m/6) with a quadratic phase, times
// x (k = 1) or y (k = 2) ... for the weaker modes.
std::vector<cf> probe_mode(int m, int k, double curvature) {
  std::vector<cf> p(static_cast<std::size_t>(m) * m);
  const double c = (m - 1) / 2.0, s = m / 6.0;
  const double weight = k == 0 ? 1.0 : 0.5 / k;
  for (int y = 0; y < m; ++y)
    for (int x = 0; x < m; ++x) {
      const double dx = (x - c) / s, dy = (y - c) / s;
      double shape = std::exp(-(dx * dx + dy * dy) / 2);
      if (k % 2 == 1) shape *= dx;
      else if (k > 0) shape *= dy;
      p[static_cast<std::size_t>(y) * m + x] = std::polar(weight * shape, curvature * (dx * dx + dy * dy));
    }
  return p;
}

}  // namespace

json::object ptycho_reconstruct(const json::object& args, TaskContext& ctx) {
  const int n = static_cast<int>(arg_number(args, "object_size", 64));
  const int m = static_cast<int>(arg_number(args, "probe_size", 16));
  const int step = static_cast<int>(arg_number(args, "scan_step", 4));
  const long iterations = static_cast<long>(arg_number(args, "iterations", 50));
  const int modes = static_cast<int>(arg_number(args, "probe_modes", 1));
  const double photons = arg_number(args, "photons", 1e5);
  const double alpha = arg_number(args, "alpha", 1.0), beta = arg_number(args, "beta", 1.0);
  (void)arg_string(args, "algorithm", "ePIE");
  // The frame: by default each instance simulates its own scan (seed from its id).
  const std::uint64_t seed = args.contains("seed") ? static_cast<std::uint64_t>(arg_number(args, "seed", 1))
                                                   : crc32c(ctx.instance().data(), ctx.instance().size());
  if (m > n) throw Error("args.probe_size must not exceed args.object_size");
  std::mt19937_64 rng(seed);
  const std::size_t nn = static_cast<std::size_t>(n) * n, mm = static_cast<std::size_t>(m) * m;

  // ---- the physics: object, probe, positions, noisy diffraction patterns
  const auto amp = blobs(n, rng, 12), phase = blobs(n, rng, 12);
  std::vector<cf> truth(nn);
  for (std::size_t i = 0; i < nn; ++i) truth[i] = std::polar(1.0 - 0.5 * amp[i], 1.2 * phase[i]);
  std::vector<std::vector<cf>> probe_true;
  for (int k = 0; k < modes; ++k) probe_true.push_back(probe_mode(m, k, 0.3));
  std::vector<std::pair<int, int>> pos;
  std::uniform_int_distribution<int> jitter(-1, 1);
  for (int y = 0; y + m <= n; y += step)
    for (int x = 0; x + m <= n; x += step)
      pos.emplace_back(std::clamp(y + jitter(rng), 0, n - m), std::clamp(x + jitter(rng), 0, n - m));
  Fft2 fft(m);
  std::vector<std::vector<double>> measured(pos.size(), std::vector<double>(mm));
  std::vector<cf> wave(mm);
  double total = 0;
  for (std::size_t j = 0; j < pos.size(); ++j) {
    auto& I = measured[j];
    for (int k = 0; k < modes; ++k) {
      for (int y = 0; y < m; ++y)
        for (int x = 0; x < m; ++x)
          wave[static_cast<std::size_t>(y) * m + x] =
              probe_true[static_cast<std::size_t>(k)][static_cast<std::size_t>(y) * m + x] *
              truth[static_cast<std::size_t>(pos[j].first + y) * n + pos[j].second + x];
      fft.forward(wave);
      for (std::size_t i = 0; i < mm; ++i) I[i] += std::norm(wave[i]);
    }
    total += std::accumulate(I.begin(), I.end(), 0.0);
  }
  const double scale = photons / (total / static_cast<double>(pos.size()));
  double counts = 0;
  for (auto& I : measured)
    for (auto& v : I) {
      const double mean = v * scale;
      v = mean > 0 ? static_cast<double>(std::poisson_distribution<long>(mean)(rng)) : 0.0;
      counts += v;
    }

  // ---- ePIE (mixed-state): flat object, Gaussian probe guesses
  std::vector<cf> obj(nn, cf(1, 0));
  std::vector<std::vector<cf>> probe;
  const double probe_scale = std::sqrt(photons / static_cast<double>(mm));
  for (int k = 0; k < modes; ++k) {
    auto p = probe_mode(m, k, 0.0);
    for (auto& v : p) v *= probe_scale / std::sqrt(static_cast<double>(mm)) * 4.0;
    probe.push_back(std::move(p));
  }
  std::vector<std::vector<cf>> psi(static_cast<std::size_t>(modes), std::vector<cf>(mm)),
      fwave(static_cast<std::size_t>(modes), std::vector<cf>(mm));
  std::vector<cf> patch(mm);
  std::vector<std::size_t> order(pos.size());
  std::iota(order.begin(), order.end(), 0);
  double error = 0;
  for (long it = 0; it < iterations; ++it) {
    const auto t0 = Clock::now();
    std::shuffle(order.begin(), order.end(), rng);
    double err_sum = 0;
    for (std::size_t j : order) {
      const auto [py, px] = pos[j];
      for (int y = 0; y < m; ++y)
        for (int x = 0; x < m; ++x)
          patch[static_cast<std::size_t>(y) * m + x] = obj[static_cast<std::size_t>(py + y) * n + px + x];
      std::vector<double> sum(mm, 0.0);
      for (int k = 0; k < modes; ++k) {
        auto& w = fwave[static_cast<std::size_t>(k)];
        for (std::size_t i = 0; i < mm; ++i) psi[static_cast<std::size_t>(k)][i] = w[i] = probe[static_cast<std::size_t>(k)][i] * patch[i];
        fft.forward(w);
        for (std::size_t i = 0; i < mm; ++i) sum[i] += std::norm(w[i]);
      }
      const auto& I = measured[j];
      for (std::size_t i = 0; i < mm; ++i) {
        const double d = std::sqrt(sum[i]) - std::sqrt(I[i]);
        err_sum += d * d;
      }
      double pmax = 0, omax = 0;
      for (std::size_t i = 0; i < mm; ++i) {
        double ps = 0;
        for (int k = 0; k < modes; ++k) ps += std::norm(probe[static_cast<std::size_t>(k)][i]);
        pmax = std::max(pmax, ps);
        omax = std::max(omax, std::norm(patch[i]));
      }
      for (int k = 0; k < modes; ++k) {
        auto& w = fwave[static_cast<std::size_t>(k)];
        for (std::size_t i = 0; i < mm; ++i) w[i] *= std::sqrt(I[i]) / std::sqrt(sum[i] + 1e-12);
        fft.inverse(w);
        auto& p = probe[static_cast<std::size_t>(k)];
        for (std::size_t i = 0; i < mm; ++i) {
          const cf d = w[i] - psi[static_cast<std::size_t>(k)][i];
          const std::size_t oi = static_cast<std::size_t>(py + static_cast<int>(i) / m) * n + px + static_cast<int>(i) % m;
          obj[oi] += alpha * std::conj(p[i]) * d / (pmax + 1e-12);
          p[i] += beta * std::conj(patch[i]) * d / (omax + 1e-12);
        }
      }
    }
    error = err_sum / std::max(counts, 1.0);
    if (!ctx.step_done(it + 1, iterations, std::chrono::duration<double>(Clock::now() - t0).count())) return {};
  }

  // The object's error against the truth over the scanned area, after removing the global
  // phase (ptychography determines the object only up to it) and scale.
  cf dot(0, 0);
  double norm_o = 0;
  for (std::size_t i = 0; i < nn; ++i) {
    dot += std::conj(obj[i]) * truth[i];
    norm_o += std::norm(obj[i]);
  }
  const cf g = norm_o > 0 ? dot / norm_o : cf(1, 0);
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < nn; ++i) {
    diff += std::norm(g * obj[i] - truth[i]);
    ref += std::norm(truth[i]);
  }
  // The scan file (diaspora/scan_file.hpp): what a learner needs to train on this scan,
  // the patterns and the reconstruction that labels them.
  ScanFile out;
  out.object_size = static_cast<std::uint32_t>(n);
  out.patch = static_cast<std::uint32_t>(m);
  for (const auto& [py, px] : pos) out.positions.emplace_back(py, px);
  out.diffraction.reserve(pos.size() * mm);
  for (const auto& I : measured)
    for (double v : I) out.diffraction.push_back(static_cast<float>(std::sqrt(v)));
  out.probe_intensity.assign(mm, 0.0f);
  for (const auto& p : probe)
    for (std::size_t i = 0; i < mm; ++i) out.probe_intensity[i] += static_cast<float>(std::norm(p[i]));
  for (const auto& v : obj) out.object.emplace_back(static_cast<float>(v.real()), static_cast<float>(v.imag()));
  const std::string bytes = encode_scan(out);
  const std::filesystem::path file = std::filesystem::path(ctx.data_dir()) / (ctx.instance() + ".scan");
  write_file_atomic(file, bytes, 0644, Durability::file);
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", crc32c(bytes.data(), bytes.size()));
  return {{"file", file.string()},
          {"bytes", static_cast<std::int64_t>(bytes.size())},
          {"checksum", std::string("crc32c:") + crc},
          {"shape", json::array{n, n}},
          {"positions", static_cast<std::int64_t>(pos.size())},
          {"fourier_error", error},
          {"object_error", std::sqrt(diff / std::max(ref, 1e-300))}};
}

}  // namespace diaspora::runner
