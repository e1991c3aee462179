// The data streams: Fashion-MNIST (gzipped IDX via zlib), the class-incremental split,
// and ptycho-sim.
#include <ATen/ops/abs.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/zeros.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "diaspora/datasets.hpp"
#include "rehearsal_test_util.hpp"

namespace dr = diaspora::rehearsal;
using diaspora::rehearsal::test::TempDir;

namespace {

// ---------------------------------------------------------------------------------------
// Fashion-MNIST

std::vector<std::int64_t> class_counts(const at::Tensor& labels) {
  std::vector<std::int64_t> c(10, 0);
  const at::Tensor l = labels.contiguous();
  const auto* p = l.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < l.size(0); ++i) ++c.at(static_cast<std::size_t>(p[i]));
  return c;
}

void require_fashion_mnist() {
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"}) {
    const auto p = std::filesystem::path(dr::kFashionMnistDir) / f;
    ASSERT_TRUE(std::filesystem::exists(p))
        << p << " is missing: install dataset-fashion-mnist (scripts/install-deps.sh installs it)";
  }
}

TEST(FashionMnist, TrainSplitShapesAndClassCounts) {
  require_fashion_mnist();
  const dr::FashionMnist d = dr::load_fashion_mnist(dr::kFashionMnistDir, /*train=*/true);
  EXPECT_EQ(d.images.sizes(), (std::vector<std::int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(d.images.scalar_type(), at::kFloat);
  EXPECT_EQ(d.labels.sizes(), (std::vector<std::int64_t>{60000}));
  EXPECT_EQ(d.labels.scalar_type(), at::kLong);
  EXPECT_GE(d.images.min().item<float>(), 0.0f);
  EXPECT_LE(d.images.max().item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(d.images.max().item<float>(), 1.0f);  // some pixel is 255
  EXPECT_GT(d.images.mean().item<float>(), 0.1f);       // not all zeros (mean ~ 0.286)
  EXPECT_EQ(class_counts(d.labels), std::vector<std::int64_t>(10, 6000));
}

TEST(FashionMnist, TestSplitShapesAndClassCounts) {
  require_fashion_mnist();
  const dr::FashionMnist d = dr::load_fashion_mnist(dr::kFashionMnistDir, /*train=*/false);
  EXPECT_EQ(d.images.sizes(), (std::vector<std::int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(d.labels.sizes(), (std::vector<std::int64_t>{10000}));
  EXPECT_EQ(class_counts(d.labels), std::vector<std::int64_t>(10, 1000));
}

void put_be32(std::vector<unsigned char>& v, std::uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<unsigned char>(x >> s));
}

void write_gz(const std::filesystem::path& p, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<unsigned char> images_idx(std::uint32_t magic, std::uint32_t n, std::uint32_t pixels_of, std::uint32_t side = 28) {
  std::vector<unsigned char> v;
  put_be32(v, magic);
  put_be32(v, n);
  put_be32(v, side);
  put_be32(v, side);
  for (std::uint32_t i = 0; i < pixels_of * side * side; ++i) v.push_back(static_cast<unsigned char>(i % 256));
  return v;
}

std::vector<unsigned char> labels_idx(std::uint32_t magic, std::uint32_t n, std::uint32_t labels_of) {
  std::vector<unsigned char> v;
  put_be32(v, magic);
  put_be32(v, n);
  for (std::uint32_t i = 0; i < labels_of; ++i) v.push_back(static_cast<unsigned char>(i % 10));
  return v;
}

// Runs load_fashion_mnist on `dir` and returns the RehearsalError's message ("" if none).
std::string load_error(const std::filesystem::path& dir, bool train = true) {
  try {
    (void)dr::load_fashion_mnist(dir, train);
  } catch (const dr::RehearsalError& e) {
    return e.what();
  }
  return "";
}

TEST(FashionMnist, SmallValidFilesLoad) {
  TempDir tmp;
  write_gz(tmp.path() / "t10k-images-idx3-ubyte.gz", images_idx(0x803, 20, 20));
  write_gz(tmp.path() / "t10k-labels-idx1-ubyte.gz", labels_idx(0x801, 20, 20));
  const dr::FashionMnist d = dr::load_fashion_mnist(tmp.path(), /*train=*/false);
  EXPECT_EQ(d.images.sizes(), (std::vector<std::int64_t>{20, 1, 28, 28}));
  EXPECT_FLOAT_EQ(d.images[0][0][0][5].item<float>(), 5.0f / 255.0f);
  EXPECT_EQ(d.labels[13].item<std::int64_t>(), 3);
}

TEST(FashionMnist, BadMagicNamesTheFile) {
  TempDir tmp;
  write_gz(tmp.path() / "train-images-idx3-ubyte.gz", images_idx(0x803, 4, 4));
  write_gz(tmp.path() / "train-labels-idx1-ubyte.gz", labels_idx(0x802, 4, 4));
  const std::string msg = load_error(tmp.path());
  EXPECT_NE(msg.find("train-labels-idx1-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;

  write_gz(tmp.path() / "train-images-idx3-ubyte.gz", images_idx(0x801, 4, 4));
  write_gz(tmp.path() / "train-labels-idx1-ubyte.gz", labels_idx(0x801, 4, 4));
  const std::string msg2 = load_error(tmp.path());
  EXPECT_NE(msg2.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("magic"), std::string::npos) << msg2;
}

TEST(FashionMnist, TruncatedIdxNamesTheFile) {
  TempDir tmp;
  write_gz(tmp.path() / "train-images-idx3-ubyte.gz", images_idx(0x803, 10, 5));  // header says 10, data 5
  write_gz(tmp.path() / "train-labels-idx1-ubyte.gz", labels_idx(0x801, 10, 10));
  const std::string msg = load_error(tmp.path());
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  write_gz(tmp.path() / "train-images-idx3-ubyte.gz", images_idx(0x803, 10, 10));
  write_gz(tmp.path() / "train-labels-idx1-ubyte.gz", labels_idx(0x801, 10, 7));
  const std::string msg2 = load_error(tmp.path());
  EXPECT_NE(msg2.find("train-labels-idx1-ubyte.gz"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("truncated"), std::string::npos) << msg2;
}

TEST(FashionMnist, TruncatedGzipStreamNamesTheFile) {
  TempDir tmp;
  const auto img = tmp.path() / "train-images-idx3-ubyte.gz";
  write_gz(img, images_idx(0x803, 200, 200));
  write_gz(tmp.path() / "train-labels-idx1-ubyte.gz", labels_idx(0x801, 200, 200));
  std::filesystem::resize_file(img, std::filesystem::file_size(img) / 2);  // cut the compressed stream
  const std::string msg = load_error(tmp.path());
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(FashionMnist, CountMismatchBadDimsBadLabelTrailingData) {
  TempDir tmp;
  const auto img = tmp.path() / "train-images-idx3-ubyte.gz";
  const auto lab = tmp.path() / "train-labels-idx1-ubyte.gz";
  write_gz(img, images_idx(0x803, 10, 10));
  write_gz(lab, labels_idx(0x801, 9, 9));
  std::string msg = load_error(tmp.path());
  EXPECT_NE(msg.find("10 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("9 labels"), std::string::npos) << msg;

  write_gz(img, images_idx(0x803, 2, 2, 27));
  write_gz(lab, labels_idx(0x801, 2, 2));
  msg = load_error(tmp.path());
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("27x27"), std::string::npos) << msg;

  auto bad_label = labels_idx(0x801, 2, 2);
  bad_label.back() = 10;
  write_gz(img, images_idx(0x803, 2, 2));
  write_gz(lab, bad_label);
  msg = load_error(tmp.path());
  EXPECT_NE(msg.find("train-labels-idx1-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("label 10"), std::string::npos) << msg;

  write_gz(img, images_idx(0x803, 2, 3));
  write_gz(lab, labels_idx(0x801, 2, 2));
  msg = load_error(tmp.path());
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;
}

TEST(FashionMnist, MissingFilesGiveTheInstallHint) {
  TempDir tmp;
  const std::string msg = load_error(tmp.path() / "nowhere");
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("install dataset-fashion-mnist"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------
// Class-incremental split

TEST(ClassIncrementalSplit, FiveTasksOfTwoClassesDisjointAndCovering) {
  // 10 classes in a scrambled order with unequal counts.
  std::vector<std::int64_t> lv;
  for (int i = 0; i < 1000; ++i) lv.push_back((i * 7 + i / 13) % 10);
  const at::Tensor labels = at::empty({1000}, at::kLong);
  std::copy(lv.begin(), lv.end(), labels.data_ptr<std::int64_t>());

  const auto split = dr::class_incremental_split(labels, 5, 2);
  ASSERT_EQ(split.size(), 5u);
  std::set<std::int64_t> seen;
  std::int64_t total = 0;
  for (int t = 0; t < 5; ++t) {
    const auto& s = split[static_cast<std::size_t>(t)];
    EXPECT_EQ(s.task, t);
    EXPECT_EQ(s.classes, (std::vector<std::int64_t>{2 * t, 2 * t + 1}));
    ASSERT_EQ(s.indices.dim(), 1);
    const auto* p = s.indices.data_ptr<std::int64_t>();
    std::int64_t expected = 0;
    for (std::int64_t v : lv) expected += (v / 2 == t);
    EXPECT_EQ(s.indices.size(0), expected);
    for (std::int64_t i = 0; i < s.indices.size(0); ++i) {
      EXPECT_EQ(lv[static_cast<std::size_t>(p[i])] / 2, t);
      if (i > 0) {
        EXPECT_LT(p[i - 1], p[i]);  // ascending
      }
      EXPECT_TRUE(seen.insert(p[i]).second) << "index " << p[i] << " in two tasks";
    }
    total += s.indices.size(0);
  }
  EXPECT_EQ(total, 1000);
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(ClassIncrementalSplit, RealFashionMnistTestSet) {
  require_fashion_mnist();
  const dr::FashionMnist d = dr::load_fashion_mnist(dr::kFashionMnistDir, false);
  const auto split = dr::class_incremental_split(d.labels);
  ASSERT_EQ(split.size(), 5u);
  for (const auto& s : split) EXPECT_EQ(s.indices.size(0), 2000);
}

TEST(ClassIncrementalSplit, RejectsBadArguments) {
  const at::Tensor labels = at::arange(10, at::kLong);
  EXPECT_THROW(dr::class_incremental_split(labels, 4, 2), dr::RehearsalError);  // label 8, 9 out of range
  EXPECT_THROW(dr::class_incremental_split(labels, 0, 2), dr::RehearsalError);
  EXPECT_THROW(dr::class_incremental_split(labels.to(at::kFloat), 5, 2), dr::RehearsalError);
  EXPECT_THROW(dr::class_incremental_split(labels.reshape({2, 5}), 5, 2), dr::RehearsalError);
  EXPECT_THROW(dr::class_incremental_split(at::full({1}, -1, at::kLong), 5, 2), dr::RehearsalError);
}

// ---------------------------------------------------------------------------------------
// train.augment: shift-flip

// One lit pixel a image (row 14, column 10, 2 channels): after shift_flip it is at
// (14 + dy, 10 + dx), or mirrored at (14 + dy, 17 + dx), with |dy|, |dx| <= 2, in both
// channels; the batch uses both orientations and every shift; the draws are the same for
// the same (seed, stream) only.
TEST(ShiftFlip, MirrorsAndShiftsEachImageWithinBoundsDeterministically) {
  const std::int64_t n = 256;
  at::Tensor x = at::zeros({n, 2, 28, 28});
  x.select(2, 14).select(2, 10).fill_(1.0);
  const at::Tensor before = x.clone();
  const at::Tensor y = dr::shift_flip(x, 7, 3);
  EXPECT_TRUE(at::equal(x, before));  // the input is not changed
  ASSERT_EQ(y.sizes(), x.sizes());
  std::set<std::int64_t> dys, dxs;
  int flipped = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const at::Tensor img = y[i][0];
    ASSERT_EQ(img.sum().item<float>(), 1.0f) << "image " << i;
    ASSERT_TRUE(at::equal(y[i][0], y[i][1])) << "image " << i;
    const std::int64_t at_ = img.flatten().argmax().item<std::int64_t>();
    const std::int64_t r = at_ / 28, c = at_ % 28, dy = r - 14;
    const bool mirrored = std::abs(c - 17) <= 2;
    const std::int64_t dx = mirrored ? c - 17 : c - 10;
    ASSERT_LE(std::abs(dy), 2) << "image " << i;
    ASSERT_LE(std::abs(dx), 2) << "image " << i;
    flipped += mirrored ? 1 : 0;
    dys.insert(dy);
    dxs.insert(dx);
  }
  EXPECT_GT(flipped, n / 4);
  EXPECT_LT(flipped, 3 * n / 4);
  EXPECT_EQ(dys.size(), 5u);
  EXPECT_EQ(dxs.size(), 5u);
  EXPECT_TRUE(at::equal(dr::shift_flip(x, 7, 3), y));
  EXPECT_FALSE(at::equal(dr::shift_flip(x, 7, 4), y));
  EXPECT_FALSE(at::equal(dr::shift_flip(x, 8, 3), y));
  // max_shift 0: only mirrors; pixels shifted in are 0 (a full image loses a border).
  const at::Tensor m = dr::shift_flip(x, 7, 3, 0);
  for (std::int64_t i = 0; i < 8; ++i) {
    const std::int64_t c = m[i][0][14].argmax().item<std::int64_t>();
    EXPECT_TRUE(c == 10 || c == 17) << c;
  }
  const at::Tensor full = dr::shift_flip(at::full({n, 1, 28, 28}, 1.0), 1, 1);
  EXPECT_LT(full.sum().item<double>(), static_cast<double>(n) * 784);
  EXPECT_GE(full.sum().item<double>(), static_cast<double>(n) * 26 * 26);
}

TEST(ShiftFlip, RejectsBadArguments) {
  EXPECT_THROW(dr::shift_flip(at::zeros({2, 28, 28}), 0, 0), dr::RehearsalError);
  EXPECT_THROW(dr::shift_flip(at::zeros({2, 1, 28, 28}, at::kLong), 0, 0), dr::RehearsalError);
  EXPECT_THROW(dr::shift_flip(at::zeros({2, 1, 28, 28}), 0, 0, -1), dr::RehearsalError);
  EXPECT_THROW(dr::shift_flip(at::zeros({2, 1, 28, 4}), 0, 0, 4), dr::RehearsalError);
  EXPECT_THROW(dr::shift_flip(at::Tensor(), 0, 0), dr::RehearsalError);
}

// ---------------------------------------------------------------------------------------
// ptycho-sim

TEST(PtychoSim, ShapesAndRanges) {
  const dr::PtychoConfig cfg;  // n = 32, S = 128, step 8: 13 x 13 positions
  const dr::PtychoScan s = dr::simulate_ptycho(cfg, 0, 42);
  const std::vector<std::int64_t> pat{169, 1, 32, 32};
  EXPECT_EQ(s.diffraction.sizes(), pat);
  EXPECT_EQ(s.amplitude.sizes(), pat);
  EXPECT_EQ(s.phase.sizes(), pat);
  EXPECT_EQ(s.counts.sizes(), pat);
  EXPECT_EQ(s.expected_counts.sizes(), pat);
  EXPECT_EQ(s.exit_waves.sizes(), (std::vector<std::int64_t>{169, 32, 32}));
  EXPECT_EQ(s.positions.sizes(), (std::vector<std::int64_t>{169, 2}));
  EXPECT_EQ(s.probe.sizes(), (std::vector<std::int64_t>{32, 32}));
  EXPECT_EQ(s.object.sizes(), (std::vector<std::int64_t>{128, 128}));
  EXPECT_EQ(s.diffraction.scalar_type(), at::kFloat);
  EXPECT_EQ(s.amplitude.scalar_type(), at::kFloat);
  EXPECT_EQ(s.phase.scalar_type(), at::kFloat);
  EXPECT_EQ(s.positions.scalar_type(), at::kLong);
  EXPECT_EQ(s.positions[168][0].item<std::int64_t>(), 96);
  EXPECT_EQ(s.positions[168][1].item<std::int64_t>(), 96);
  EXPECT_EQ(s.positions[1][1].item<std::int64_t>(), 8);

  EXPECT_GE(s.amplitude.min().item<float>(), 0.5f - 1e-6f);
  EXPECT_LE(s.amplitude.max().item<float>(), 1.0f + 1e-6f);
  const float half_pi = static_cast<float>(std::numbers::pi / 2);
  EXPECT_GE(s.phase.min().item<float>(), -half_pi - 1e-5f);
  EXPECT_LE(s.phase.max().item<float>(), half_pi + 1e-5f);
  EXPECT_GT(s.phase.max().item<float>() - s.phase.min().item<float>(), 1.0f);  // not flat
  // diffraction = sqrt(counts), counts are non-negative integers.
  EXPECT_TRUE(at::allclose(s.diffraction.mul(s.diffraction), s.counts, 1e-5, 1e-3));
  EXPECT_TRUE(at::equal(s.counts, s.counts.round()));
  EXPECT_GE(s.counts.min().item<float>(), 0.0f);
  // The targets are the object on the patch.
  const std::int64_t y = s.positions[20][0].item<std::int64_t>();
  const std::int64_t x = s.positions[20][1].item<std::int64_t>();
  const at::Tensor patch = s.object.slice(0, y, y + 32).slice(1, x, x + 32);
  EXPECT_TRUE(at::allclose(at::abs(patch), s.amplitude[20][0], 1e-5, 1e-5));
  // Zero frequency is at the centre after fftshift: the brightest pixel of the mean pattern.
  const at::Tensor mean_pattern = s.expected_counts.mean(0).reshape({-1});
  EXPECT_EQ(mean_pattern.argmax().item<std::int64_t>(), 16 * 32 + 16);
}

TEST(PtychoSim, DeterministicPerSeedAndTask) {
  const dr::PtychoConfig cfg;
  const dr::PtychoScan a = dr::simulate_ptycho(cfg, 1, 7);
  const dr::PtychoScan b = dr::simulate_ptycho(cfg, 1, 7);
  EXPECT_TRUE(at::equal(a.diffraction, b.diffraction));
  EXPECT_TRUE(at::equal(a.amplitude, b.amplitude));
  EXPECT_TRUE(at::equal(a.phase, b.phase));
  EXPECT_TRUE(at::equal(a.object, b.object));

  const dr::PtychoScan c = dr::simulate_ptycho(cfg, 2, 7);  // another task
  EXPECT_FALSE(at::equal(a.object, c.object));
  EXPECT_GT(at::abs(a.amplitude.sub(c.amplitude)).mean().item<float>(), 1e-2f);
  EXPECT_TRUE(at::equal(a.probe, c.probe));  // same instrument

  const dr::PtychoScan d = dr::simulate_ptycho(cfg, 1, 8);  // another seed
  EXPECT_FALSE(at::equal(a.object, d.object));
}

TEST(PtychoSim, ParsevalBeforeNoise) {
  dr::PtychoConfig cfg;
  cfg.poisson = false;
  const dr::PtychoScan s = dr::simulate_ptycho(cfg, 3, 11);
  const double n2 = 32.0 * 32.0;
  const at::Tensor intensity = dr::far_field_intensity(s.exit_waves).to(at::kDouble);  // [P,n,n]
  const at::Tensor ew = at::abs(s.exit_waves).to(at::kDouble);
  const at::Tensor lhs = intensity.sum({1, 2});
  const at::Tensor rhs = ew.mul(ew).sum({1, 2}).mul(n2);
  const at::Tensor rel = at::abs(lhs.sub(rhs)).div(rhs);
  EXPECT_LT(rel.max().item<double>(), 1e-3);
  // The exit wave is probe x object patch, and the expected counts are the scaled
  // (shifted) intensities: the same totals.
  const at::Tensor counts_total = s.expected_counts.to(at::kDouble).sum({1, 2, 3});
  EXPECT_LT(at::abs(counts_total.sub(lhs.mul(s.photon_scale))).div(counts_total).max().item<double>(), 1e-3);
  // A fully transparent patch would get `photons`; |O| in [0.5,1] gives between 1/4 and 1.
  EXPECT_LE(counts_total.max().item<double>(), cfg.photons * 1.001);
  EXPECT_GE(counts_total.min().item<double>(), cfg.photons * 0.25 * 0.999);
  // No noise: counts are the expected counts.
  EXPECT_TRUE(at::equal(s.counts, s.expected_counts));
  const at::Tensor ex = s.exit_waves[5];
  const at::Tensor pr = s.probe;
  const std::int64_t y = s.positions[5][0].item<std::int64_t>();
  const std::int64_t x = s.positions[5][1].item<std::int64_t>();
  EXPECT_TRUE(at::allclose(ex, pr.mul(s.object.slice(0, y, y + 32).slice(1, x, x + 32)), 1e-5, 1e-6));
}

TEST(PtychoSim, PoissonNoiseMeanAndVariance) {
  const dr::PtychoConfig cfg;
  const dr::PtychoScan s = dr::simulate_ptycho(cfg, 0, 5);
  const at::Tensor lam = s.expected_counts.to(at::kDouble).reshape({-1});
  const at::Tensor k = s.counts.to(at::kDouble).reshape({-1});
  EXPECT_FALSE(at::equal(s.counts, s.expected_counts));
  // Both branches of the sampler: low (< 10) and high (>= 10) means.
  for (const bool high : {false, true}) {
    const at::Tensor m = high ? lam.ge(10.0) : lam.lt(10.0).logical_and(lam.gt(0.05));
    const double sum_lam = lam.masked_select(m).sum().item<double>();
    const double sum_k = k.masked_select(m).sum().item<double>();
    ASSERT_GT(sum_lam, 1000.0) << (high ? "high" : "low");
    // sum_k ~ Poisson(sum_lam): within 5 standard deviations.
    EXPECT_LT(std::abs(sum_k - sum_lam), 5 * std::sqrt(sum_lam)) << (high ? "high" : "low") << " " << sum_k << " vs " << sum_lam;
    // Variance = mean: sum (k - lam)^2 ~ sum lam (relative tolerance 5%).
    const at::Tensor d = k.masked_select(m).sub(lam.masked_select(m));
    const double sum_sq = d.mul(d).sum().item<double>();
    EXPECT_NEAR(sum_sq / sum_lam, 1.0, 0.05) << (high ? "high" : "low");
  }
}

TEST(PtychoSim, RejectsBadConfig) {
  dr::PtychoConfig c;
  c.step = 32;  // no overlap
  EXPECT_THROW(dr::simulate_ptycho(c, 0, 1), dr::RehearsalError);
  c = {};
  c.object_size = 16;
  EXPECT_THROW(dr::simulate_ptycho(c, 0, 1), dr::RehearsalError);
  c = {};
  c.photons = 0;
  EXPECT_THROW(dr::simulate_ptycho(c, 0, 1), dr::RehearsalError);
  EXPECT_THROW(dr::simulate_ptycho(dr::PtychoConfig{}, -1, 1), dr::RehearsalError);
}

// The reason for ptycho_error's definition: a constant phase factor leaves every pattern
// unchanged, so no model can recover a patch's mean phase from its pattern.
TEST(PtychoSim, AConstantPhaseFactorLeavesThePatternUnchanged) {
  dr::PtychoConfig cfg;
  cfg.poisson = false;
  const dr::PtychoScan s = dr::simulate_ptycho(cfg, 0, 3);
  const at::Tensor shifted = s.exit_waves.mul(c10::complex<double>(std::cos(0.9), std::sin(0.9)));
  const at::Tensor a = dr::far_field_intensity(s.exit_waves);
  const at::Tensor b = dr::far_field_intensity(shifted);
  EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-3));
  EXPECT_FALSE(at::allclose(s.exit_waves, shifted, 1e-4, 1e-3));
}

TEST(PtychoError, IlluminationWeightIsTheNormalisedProbeIntensity) {
  const dr::PtychoScan s = dr::simulate_ptycho(dr::PtychoConfig{}, 0, 1);
  const at::Tensor w = dr::illumination_weight(s.probe);
  ASSERT_EQ(w.sizes(), (std::vector<std::int64_t>{32, 32}));
  EXPECT_NEAR(w.sum().item<double>(), 1.0, 1e-5);
  // Gaussian probe, sigma = n/6: bright in the centre, dark in the corners.
  EXPECT_GT(w[16][16].item<double>(), 1e3 * w[0][0].item<double>() + 1e-12);
  EXPECT_LT(w[0][0].item<double>(), 1e-9);
  // The share of the patch below 1 % of the peak (the docs say 60 %).
  const double dark = w.lt(w.max().item<double>() * 0.01).sum().item<double>() / (32.0 * 32.0);
  EXPECT_NEAR(dark, 0.60, 0.03);
  EXPECT_THROW(dr::illumination_weight(at::zeros({4, 4}, at::kComplexFloat)), dr::RehearsalError);
  EXPECT_THROW(dr::illumination_weight(at::zeros({4, 4})), dr::RehearsalError);  // not complex
}

TEST(PtychoError, ZeroForTheTargetAndBlindToAConstantPhaseOnly) {
  const dr::PtychoScan s = dr::simulate_ptycho(dr::PtychoConfig{}, 0, 1);
  const at::Tensor w = dr::illumination_weight(s.probe);
  at::Tensor target = at::rand({3, 2, 32, 32});
  EXPECT_LT(dr::ptycho_error(target, target, w).abs().max().item<double>(), 1e-9);
  // A constant phase offset, different per sample: still zero.
  at::Tensor pred = target.clone();
  pred.select(1, 1).add_(at::arange(3, at::kFloat).mul(0.7).view({3, 1, 1}));
  EXPECT_LT(dr::ptycho_error(pred, target, w).abs().max().item<double>(), 1e-9);
  // A curved phase error is not a constant: its variance about the *weighted* mean, halved
  // (curved, so its weighted and unweighted means differ under the symmetric probe).
  pred = target.clone();
  const at::Tensor bend = at::arange(32, at::kFloat).mul(0.1).pow(2).view({1, 32}).expand({32, 32});
  pred.select(1, 1).add_(bend);
  const at::Tensor mean = bend.mul(w).sum();
  ASSERT_GT(std::abs(mean.item<double>() - bend.mean().item<double>()), 0.1);
  const double want = bend.sub(mean).pow(2).mul(w).sum().item<double>() / 2;
  const at::Tensor got = dr::ptycho_error(pred, target, w);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i].item<double>(), want, 1e-6);
  EXPECT_GT(want, 1e-3);
  // Any non-negative weight is normalised first: a scaled weight gives the same error.
  const at::Tensor scaled = dr::ptycho_error(pred, target, w.mul(7.0));
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(scaled[i].item<double>(), want, 1e-6);
}

TEST(PtychoError, AmplitudeErrorIsWeightedByIllumination) {
  const dr::PtychoScan s = dr::simulate_ptycho(dr::PtychoConfig{}, 0, 1);
  const at::Tensor w = dr::illumination_weight(s.probe);
  const at::Tensor target = at::rand({1, 2, 32, 32});
  // A large error where the probe is dark costs nothing measurable...
  at::Tensor pred = target.clone();
  pred[0][0][0][0] += 1.0;
  pred[0][0][31][31] += 1.0;
  EXPECT_LT(dr::ptycho_error(pred, target, w).item<double>(), 1e-9);
  // ... and one in the illuminated centre costs w * d^2 / 2 (mean of the two channels).
  pred = target.clone();
  pred[0][0][16][16] += 0.5;
  EXPECT_NEAR(dr::ptycho_error(pred, target, w).item<double>(), w[16][16].item<double>() * 0.25 / 2, 1e-7);
}

TEST(PtychoError, RejectsMismatchedShapes) {
  const at::Tensor w = at::full({32, 32}, 1.0 / 1024);
  const at::Tensor a = at::rand({2, 2, 32, 32});
  EXPECT_THROW(dr::ptycho_error(a, at::rand({2, 2, 32, 16}), w), dr::RehearsalError);
  EXPECT_THROW(dr::ptycho_error(at::rand({2, 1, 32, 32}), at::rand({2, 1, 32, 32}), w), dr::RehearsalError);
  EXPECT_THROW(dr::ptycho_error(a, a, at::full({16, 16}, 1.0)), dr::RehearsalError);
}

}  // namespace
