// Fashion-MNIST (gzipped IDX via zlib) and ptycho-sim (docs/rehearsal.md, "Data").
#include "diaspora/datasets.hpp"

#include <ATen/ops/abs.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/fft_fft2.h>
#include <ATen/ops/fft_fftshift.h>
#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>
#include <c10/util/complex.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>

#include "random.hpp"

namespace diaspora::rehearsal {

namespace {

// ---------------------------------------------------------------------------------------
// IDX over zlib

constexpr const char* kInstallHint =
    "install dataset-fashion-mnist (scripts/install-deps.sh) or pass the directory holding "
    "the gzipped IDX files";

class GzFile {
 public:
  explicit GzFile(std::filesystem::path path) : path_(std::move(path)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_, ec)) {
      throw RehearsalError("Fashion-MNIST: " + path_.string() + " does not exist or is not a regular file; " +
                           kInstallHint);
    }
    f_ = gzopen(path_.c_str(), "rb");
    if (f_ == nullptr) {
      throw RehearsalError("Fashion-MNIST: cannot open " + path_.string() + ": " + std::strerror(errno) + "; " +
                           kInstallHint);
    }
    gzbuffer(f_, 1 << 18);
  }
  ~GzFile() {
    if (f_ != nullptr) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  const std::filesystem::path& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw RehearsalError("Fashion-MNIST: " + path_.string() + ": " + what +
                         "; the file is damaged or not a Fashion-MNIST IDX file: reinstall "
                         "dataset-fashion-mnist (apt-get install --reinstall dataset-fashion-mnist)");
  }

  /// Reads up to n bytes; returns how many were read (short only at the end of the data).
  std::size_t read_some(unsigned char* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      const int r = gzread(f_, out + got, chunk);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(f_, &code);
        fail(std::string("not a valid gzip stream (zlib: ") + (msg ? msg : "unknown error") + ")");
      }
      if (r == 0) {
        // A cut gzip stream ends with Z_BUF_ERROR ("unexpected end of file").
        int code = 0;
        const char* msg = gzerror(f_, &code);
        if (code != Z_OK && code != Z_STREAM_END) {
          fail("truncated or corrupt gzip stream after " + std::to_string(got) + " of " + std::to_string(n) +
               " bytes (zlib: " + (msg ? msg : "unknown error") + ")");
        }
        break;
      }
      got += static_cast<std::size_t>(r);
    }
    return got;
  }

  void read_exact(unsigned char* out, std::size_t n, const char* what) {
    const std::size_t got = read_some(out, n);
    if (got != n) {
      fail("truncated: expected " + std::to_string(n) + " bytes of " + what + ", the file has " +
           std::to_string(got));
    }
  }

  std::uint32_t read_be32(const char* what) {
    std::array<unsigned char, 4> b{};
    read_exact(b.data(), 4, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  }

  void expect_end() {
    unsigned char extra = 0;
    if (read_some(&extra, 1) != 0) fail("trailing data after the last sample");
  }

 private:
  std::filesystem::path path_;
  gzFile f_ = nullptr;
};

std::string hex(std::uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// ---------------------------------------------------------------------------------------
// ptycho-sim helpers

double uniform01(Rng& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

// Poisson(lambda): Knuth's product method below 10, Hörmann's PTRS (as in NumPy) above.
std::int64_t poisson(Rng& rng, double lambda) {
  if (!(lambda > 0)) return 0;
  if (lambda < 10) {
    const double limit = std::exp(-lambda);
    double prod = uniform01(rng);
    std::int64_t k = 0;
    while (prod > limit) {
      ++k;
      prod *= uniform01(rng);
    }
    return k;
  }
  const double slam = std::sqrt(lambda);
  const double loglam = std::log(lambda);
  const double b = 0.931 + 2.53 * slam;
  const double a = -0.059 + 0.02483 * b;
  const double invalpha = 1.1239 + 1.1328 / (b - 3.4);
  const double vr = 0.9277 - 3.6224 / (b - 2);
  for (;;) {
    const double u = uniform01(rng) - 0.5;
    const double v = uniform01(rng);
    const double us = 0.5 - std::fabs(u);
    const double k = std::floor((2 * a / us + b) * u + lambda + 0.43);
    if (us >= 0.07 && v <= vr) return static_cast<std::int64_t>(k);
    if (k < 0 || (us < 0.013 && v > us)) continue;
    if (std::log(v) + std::log(invalpha) - std::log(a / (us * us) + b) <= -lambda + k * loglam - std::lgamma(k + 1)) {
      return static_cast<std::int64_t>(k);
    }
  }
}

// A smooth field on S x S: a sum of `blobs` Gaussians of random sign, centre and width,
// min-max normalised to [0,1].
std::vector<double> smooth_field(Rng& rng, int s, int blobs) {
  std::vector<double> f(static_cast<std::size_t>(s) * s, 0.0);
  for (int b = 0; b < blobs; ++b) {
    const double cy = uniform01(rng) * s;
    const double cx = uniform01(rng) * s;
    const double w = s / 16.0 + uniform01(rng) * (s / 4.0 - s / 16.0);
    const double amp = (uniform01(rng) < 0.5 ? -1.0 : 1.0) * (0.5 + uniform01(rng));
    const double inv = 1.0 / (2 * w * w);
    for (int y = 0; y < s; ++y) {
      const double dy2 = (y - cy) * (y - cy);
      for (int x = 0; x < s; ++x) {
        f[static_cast<std::size_t>(y) * s + x] += amp * std::exp(-(dy2 + (x - cx) * (x - cx)) * inv);
      }
    }
  }
  const auto [lo, hi] = std::minmax_element(f.begin(), f.end());
  const double mn = *lo;
  const double range = *hi - mn;
  for (double& v : f) v = range > 0 ? (v - mn) / range : 0.5;
  return f;
}

void check_config(const PtychoConfig& c, int task) {
  auto bad = [](const std::string& what) { throw RehearsalError("ptycho-sim: " + what); };
  if (c.patch < 2) bad("patch = " + std::to_string(c.patch) + " must be >= 2");
  if (c.object_size < c.patch) {
    bad("object_size = " + std::to_string(c.object_size) + " must be >= patch = " + std::to_string(c.patch));
  }
  if (c.step < 1 || c.step >= c.patch) {
    bad("step = " + std::to_string(c.step) + " must be in [1, patch = " + std::to_string(c.patch) +
        "): consecutive patches must overlap");
  }
  if (!(c.photons > 0) || !std::isfinite(c.photons)) bad("photons must be a positive finite number");
  if (!(c.probe_sigma >= 0) || !std::isfinite(c.probe_sigma)) bad("probe_sigma must be >= 0 (0: patch / 6)");
  if (!std::isfinite(c.probe_curvature)) bad("probe_curvature must be finite");
  if (c.blobs < 1) bad("blobs = " + std::to_string(c.blobs) + " must be >= 1");
  if (task < 0) bad("task = " + std::to_string(task) + " must be >= 0");
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Fashion-MNIST

FashionMnist load_fashion_mnist(const std::filesystem::path& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  GzFile img(dir / (prefix + "-images-idx3-ubyte.gz"));
  GzFile lab(dir / (prefix + "-labels-idx1-ubyte.gz"));

  const std::uint32_t img_magic = img.read_be32("header");
  if (img_magic != 0x00000803u) img.fail("bad IDX magic number " + hex(img_magic) + " (images: 0x803 expected)");
  const std::uint32_t n = img.read_be32("header");
  const std::uint32_t rows = img.read_be32("header");
  const std::uint32_t cols = img.read_be32("header");
  if (rows != 28 || cols != 28) {
    img.fail("images are " + std::to_string(rows) + "x" + std::to_string(cols) + ", 28x28 expected");
  }

  const std::uint32_t lab_magic = lab.read_be32("header");
  if (lab_magic != 0x00000801u) lab.fail("bad IDX magic number " + hex(lab_magic) + " (labels: 0x801 expected)");
  const std::uint32_t ln = lab.read_be32("header");
  if (ln != n) {
    throw RehearsalError("Fashion-MNIST: " + img.path().string() + " holds " + std::to_string(n) + " images but " +
                         lab.path().string() + " holds " + std::to_string(ln) +
                         " labels; the files do not belong together: reinstall dataset-fashion-mnist");
  }
  if (n == 0) img.fail("holds no images");

  at::Tensor bytes = at::empty({static_cast<std::int64_t>(n), 1, 28, 28}, at::kByte);
  img.read_exact(bytes.data_ptr<std::uint8_t>(), static_cast<std::size_t>(n) * 28 * 28, "pixel data");
  img.expect_end();

  at::Tensor labels = at::empty({static_cast<std::int64_t>(n)}, at::kLong);
  std::vector<unsigned char> lb(n);
  lab.read_exact(lb.data(), n, "labels");
  lab.expect_end();
  auto* lp = labels.data_ptr<std::int64_t>();
  for (std::uint32_t i = 0; i < n; ++i) {
    if (lb[i] >= kFashionMnistClasses) {
      lab.fail("label " + std::to_string(lb[i]) + " of sample " + std::to_string(i) + " is outside [0,10)");
    }
    lp[i] = lb[i];
  }
  return FashionMnist{bytes.to(at::kFloat).div_(255.0), labels};
}

at::Tensor shift_flip(const at::Tensor& images, std::uint64_t seed, std::uint64_t stream, int max_shift) {
  if (!images.defined() || images.dim() != 4 || !at::isFloatingType(images.scalar_type()))
    throw RehearsalError("shift_flip: images must be a 4-D floating tensor [B,C,H,W]");
  const std::int64_t b = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  if (max_shift < 0 || max_shift >= h || max_shift >= w)
    throw RehearsalError("shift_flip: max_shift = " + std::to_string(max_shift) + " must be in [0, " +
                         std::to_string(std::min(h, w)) + ") for " + std::to_string(h) + " x " + std::to_string(w) +
                         " images");
  const at::Tensor in = images.to(at::kCPU).to(at::kFloat).contiguous();
  at::Tensor out = at::zeros_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  Rng rng(seed, stream);
  const auto span = static_cast<std::uint64_t>(2 * max_shift + 1);
  for (std::int64_t i = 0; i < b; ++i) {
    // Drawn in this order for every image, so (seed, stream) fixes the whole batch.
    const bool flip = rng.below(2) == 1;
    const std::int64_t dy = static_cast<std::int64_t>(rng.below(span)) - max_shift;
    const std::int64_t dx = static_cast<std::int64_t>(rng.below(span)) - max_shift;
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const float* s = src + (i * c + ch) * h * w;
      float* d = dst + (i * c + ch) * h * w;
      for (std::int64_t y = std::max<std::int64_t>(0, dy); y < std::min(h, h + dy); ++y)
        for (std::int64_t x = std::max<std::int64_t>(0, dx); x < std::min(w, w + dx); ++x) {
          const std::int64_t xs = x - dx;  // in the flipped image
          d[y * w + x] = s[(y - dy) * w + (flip ? w - 1 - xs : xs)];
        }
    }
  }
  return out;
}

std::vector<TaskSplit> class_incremental_split(const at::Tensor& labels, int tasks, int classes_per_task) {
  if (!labels.defined() || labels.dim() != 1 || !c10::isIntegralType(labels.scalar_type(), /*includeBool=*/false)) {
    throw RehearsalError("class_incremental_split: labels must be a 1-D integer tensor");
  }
  if (tasks < 1 || classes_per_task < 1) {
    throw RehearsalError("class_incremental_split: tasks = " + std::to_string(tasks) +
                         " and classes_per_task = " + std::to_string(classes_per_task) + " must both be >= 1");
  }
  const std::int64_t classes = static_cast<std::int64_t>(tasks) * classes_per_task;
  const at::Tensor l = labels.to(at::kCPU).to(at::kLong).contiguous();
  const auto* p = l.data_ptr<std::int64_t>();
  const std::int64_t n = l.size(0);
  std::vector<std::vector<std::int64_t>> idx(static_cast<std::size_t>(tasks));
  for (std::int64_t i = 0; i < n; ++i) {
    if (p[i] < 0 || p[i] >= classes) {
      throw RehearsalError("class_incremental_split: label " + std::to_string(p[i]) + " of sample " +
                           std::to_string(i) + " is outside [0, " + std::to_string(classes) + ") = [0, tasks * " +
                           "classes_per_task): raise tasks or classes_per_task");
    }
    idx[static_cast<std::size_t>(p[i] / classes_per_task)].push_back(i);
  }
  std::vector<TaskSplit> out(static_cast<std::size_t>(tasks));
  for (int t = 0; t < tasks; ++t) {
    auto& s = out[static_cast<std::size_t>(t)];
    s.task = t;
    for (int k = 0; k < classes_per_task; ++k) s.classes.push_back(static_cast<std::int64_t>(t) * classes_per_task + k);
    const auto& v = idx[static_cast<std::size_t>(t)];
    s.indices = at::empty({static_cast<std::int64_t>(v.size())}, at::kLong);
    if (!v.empty()) std::memcpy(s.indices.data_ptr<std::int64_t>(), v.data(), v.size() * sizeof(std::int64_t));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// ptycho-sim

at::Tensor far_field_intensity(const at::Tensor& exit_waves) {
  if (!exit_waves.defined() || !exit_waves.is_complex() || exit_waves.dim() < 2) {
    throw RehearsalError("far_field_intensity: exit_waves must be a complex tensor with at least 2 dims");
  }
  const at::Tensor f = at::fft_fft2(exit_waves);  // last two dims, unnormalised ("backward")
  const at::Tensor a = at::abs(f);
  return a.mul(a);
}

at::Tensor illumination_weight(const at::Tensor& probe) {
  if (!probe.defined() || !probe.is_complex() || probe.dim() != 2)
    throw RehearsalError("illumination_weight: probe must be a complex [n,n] tensor");
  const at::Tensor a = at::abs(probe).to(at::kFloat);
  const at::Tensor i = a.mul(a);
  const double total = i.sum().item<double>();
  if (!(total > 0) || !std::isfinite(total))
    throw RehearsalError("illumination_weight: the probe is dark or not finite (sum |probe|^2 = " +
                         std::to_string(total) + ")");
  return i.div(total);
}

at::Tensor ptycho_error(const at::Tensor& pred, const at::Tensor& target, const at::Tensor& weight) {
  if (pred.dim() != 4 || pred.size(1) != 2 || !pred.sizes().equals(target.sizes()) || weight.dim() != 2 ||
      weight.size(0) != pred.size(2) || weight.size(1) != pred.size(3)) {
    throw RehearsalError("ptycho_error: expected predictions and targets [B,2,n,n] and a weight [n,n], got " +
                         c10::str(pred.sizes()) + ", " + c10::str(target.sizes()) + ", " + c10::str(weight.sizes()));
  }
  const at::Tensor w = weight.div(weight.sum());  // sum 1 (illumination_weight's already is)
  const at::Tensor amp = pred.select(1, 0).sub(target.select(1, 0));
  const at::Tensor d = pred.select(1, 1).sub(target.select(1, 1));
  const at::Tensor phase = d.sub(d.mul(w).sum({1, 2}, true));  // the best constant: the weighted mean
  return amp.mul(amp).add(phase.mul(phase)).mul(w).sum({1, 2}).mul(0.5);
}

PtychoScan simulate_ptycho(const PtychoConfig& cfg, int task, std::uint64_t seed) {
  check_config(cfg, task);
  const int n = cfg.patch;
  const int s = cfg.object_size;
  const auto nn = static_cast<std::size_t>(n) * n;

  // Probe: Gaussian amplitude, quadratic phase; the same for every task.
  const double sigma = cfg.probe_sigma > 0 ? cfg.probe_sigma : n / 6.0;
  std::vector<std::complex<double>> probe(nn);
  double probe_power = 0;
  for (int y = 0; y < n; ++y) {
    for (int x = 0; x < n; ++x) {
      const double dy = y - n / 2.0 + 0.5;
      const double dx = x - n / 2.0 + 0.5;
      const double r2 = dy * dy + dx * dx;
      const double amp = std::exp(-r2 / (2 * sigma * sigma));
      const double ph = cfg.probe_curvature * r2 / ((n / 2.0) * (n / 2.0));
      probe[static_cast<std::size_t>(y) * n + x] = std::polar(amp, ph);
      probe_power += amp * amp;
    }
  }

  // Object of this task: amplitude in [0.5,1], phase in [-pi/2, pi/2].
  Rng obj_rng(seed, 2 * static_cast<std::uint64_t>(task));
  const std::vector<double> f1 = smooth_field(obj_rng, s, cfg.blobs);
  const std::vector<double> f2 = smooth_field(obj_rng, s, cfg.blobs);
  std::vector<std::complex<double>> object(static_cast<std::size_t>(s) * s);
  for (std::size_t i = 0; i < object.size(); ++i) {
    object[i] = std::polar(0.5 + 0.5 * f1[i], std::numbers::pi * (f2[i] - 0.5));
  }

  std::vector<int> grid;
  for (int p = 0; p + n <= s; p += cfg.step) grid.push_back(p);
  const auto g = static_cast<std::int64_t>(grid.size());
  const std::int64_t positions = g * g;

  PtychoScan out;
  out.positions = at::empty({positions, 2}, at::kLong);
  out.amplitude = at::empty({positions, 1, n, n}, at::kFloat);
  out.phase = at::empty({positions, 1, n, n}, at::kFloat);
  at::Tensor exit = at::empty({positions, n, n}, at::kComplexDouble);
  {
    auto* pos = out.positions.data_ptr<std::int64_t>();
    auto* amp = out.amplitude.data_ptr<float>();
    auto* ph = out.phase.data_ptr<float>();
    auto* ex = exit.data_ptr<c10::complex<double>>();
    std::int64_t p = 0;
    for (int gy : grid) {
      for (int gx : grid) {
        pos[2 * p] = gy;
        pos[2 * p + 1] = gx;
        for (int y = 0; y < n; ++y) {
          for (int x = 0; x < n; ++x) {
            const std::size_t oi = static_cast<std::size_t>(gy + y) * s + (gx + x);
            const std::size_t pi = static_cast<std::size_t>(p) * nn + static_cast<std::size_t>(y) * n + x;
            amp[pi] = static_cast<float>(0.5 + 0.5 * f1[oi]);
            ph[pi] = static_cast<float>(std::numbers::pi * (f2[oi] - 0.5));
            const std::complex<double> e = probe[static_cast<std::size_t>(y) * n + x] * object[oi];
            ex[pi] = c10::complex<double>(e.real(), e.imag());
          }
        }
        ++p;
      }
    }
  }

  out.photon_scale = cfg.photons / (static_cast<double>(nn) * probe_power);
  const at::Tensor intensity = at::fft_fftshift(far_field_intensity(exit), at::IntArrayRef{-2, -1});
  const at::Tensor expected = intensity.mul(out.photon_scale).contiguous();  // double
  out.expected_counts = expected.to(at::kFloat).reshape({positions, 1, n, n}).contiguous();

  if (cfg.poisson) {
    Rng noise_rng(seed, 2 * static_cast<std::uint64_t>(task) + 1);
    out.counts = at::empty({positions, 1, n, n}, at::kFloat);
    const auto* lam = expected.data_ptr<double>();
    auto* c = out.counts.data_ptr<float>();
    const auto total = static_cast<std::size_t>(positions) * nn;
    for (std::size_t i = 0; i < total; ++i) c[i] = static_cast<float>(poisson(noise_rng, lam[i]));
  } else {
    out.counts = out.expected_counts.clone();
  }
  out.diffraction = out.counts.sqrt();
  out.exit_waves = exit.to(at::kComplexFloat);

  out.probe = at::empty({n, n}, at::kComplexFloat);
  auto* pr = out.probe.data_ptr<c10::complex<float>>();
  for (std::size_t i = 0; i < nn; ++i) {
    pr[i] = c10::complex<float>(static_cast<float>(probe[i].real()), static_cast<float>(probe[i].imag()));
  }
  out.object = at::empty({s, s}, at::kComplexFloat);
  auto* ob = out.object.data_ptr<c10::complex<float>>();
  for (std::size_t i = 0; i < object.size(); ++i) {
    ob[i] = c10::complex<float>(static_cast<float>(object[i].real()), static_cast<float>(object[i].imag()));
  }
  return out;
}

}  // namespace diaspora::rehearsal
