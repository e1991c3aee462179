// The data streams of Diaspora's continual-learning trainer (docs/rehearsal.md, "Data"):
// Fashion-MNIST read in place from Debian's gzipped IDX files and split into
// class-incremental tasks, and ptycho-sim, a simulated ptychography stream (one synthetic
// object per task, diffraction patterns with Poisson noise, amplitude/phase targets).
//
// Errors: every function throws RehearsalError with the file or parameter at fault, what
// is wrong with it and how to fix it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "diaspora/rehearsal.hpp"

namespace diaspora::rehearsal {

// ---------------------------------------------------------------------------------------
// Fashion-MNIST

/// Where Debian's dataset-fashion-mnist package puts the gzipped IDX files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr std::int64_t kFashionMnistClasses = 10;

/// One split of Fashion-MNIST, on the CPU.
struct FashionMnist {
  at::Tensor images;  ///< Float [N,1,28,28], pixel / 255, in [0,1]
  at::Tensor labels;  ///< Long [N], in [0,10)
};

/// Reads `dir`/{train,t10k}-images-idx3-ubyte.gz and the matching labels-idx1 file with
/// zlib (no unpacking to disk). train: 60000 samples; test (train = false): 10000.
/// @throws RehearsalError naming the file if it is missing or unreadable, not a valid
///         gzip stream, has a wrong IDX magic number or dimensions, is truncated or has
///         trailing data, has a label outside [0,10), or if the image and label files
///         disagree on the sample count.
FashionMnist load_fashion_mnist(const std::filesystem::path& dir = kFashionMnistDir, bool train = true);

/// The samples of one class-incremental task.
struct TaskSplit {
  int task = 0;
  std::vector<std::int64_t> classes;  ///< task t: classes t*k .. t*k+k-1 (k = classes_per_task)
  at::Tensor indices;                 ///< Long [m], ascending indices into `labels`
};

/// Splits a stream into `tasks` tasks of `classes_per_task` consecutive classes each
/// (5 x 2 for Fashion-MNIST: classes 0-1, 2-3, ...). The tasks are disjoint and cover
/// every sample.
/// @throws RehearsalError if labels is not a 1-D integer tensor, tasks or
///         classes_per_task < 1, or a label is outside [0, tasks * classes_per_task).
std::vector<TaskSplit> class_incremental_split(const at::Tensor& labels, int tasks = 5, int classes_per_task = 2);

/// What `train.augment: shift-flip` does to the representatives of a step: each image of
/// `images` [B,C,H,W] is mirrored left-right with probability 1/2, then shifted by dy, dx
/// drawn uniformly from [-max_shift, max_shift] (pixels shifted in are 0: Fashion-MNIST's
/// background). The draws come from (seed, stream) only, so the same arguments give the
/// same batch on every rank and after a resume. Returns a new Float tensor on the CPU;
/// `images` is not changed. Thread-safe (pure).
/// @throws RehearsalError if images is not a 4-D floating tensor, or max_shift is negative
///         or not below H and W.
at::Tensor shift_flip(const at::Tensor& images, std::uint64_t seed, std::uint64_t stream, int max_shift = 2);

// ---------------------------------------------------------------------------------------
// ptycho-sim

/// Parameters of the simulated ptychography scan. Lengths are in pixels.
struct PtychoConfig {
  int patch = 32;             ///< n: probe, patch and diffraction pattern are n x n
  int object_size = 128;      ///< S: the object is S x S
  int step = 8;               ///< raster step of the scan grid; must be < patch (overlap)
  double photons = 1e4;       ///< expected photons in one pattern of a fully transparent (|O| = 1) patch
  double probe_sigma = 0;     ///< std of the Gaussian probe amplitude; 0: patch / 6
  double probe_curvature = 3.14159265358979323846;  ///< quadratic phase: c * (r / (n/2))^2 radians
  int blobs = 8;              ///< random 2D Gaussians summed into each smooth field
  bool poisson = true;        ///< false: counts = expected counts (no noise)
};

/// One task's scan. P = (number of grid positions per axis)^2; positions are
/// 0, step, 2*step, ... <= S - n on each axis.
///
/// Forward model, per position p with top-left corner (y, x):
///   exit_p   = probe * object[y:y+n, x:x+n]                          (complex, n x n)
///   I_p      = fftshift(|FFT2(exit_p)|^2)     (unnormalised DFT: sum I_p = n^2 sum |exit_p|^2)
///   expected = I_p * photon_scale,  photon_scale = photons / (n^2 * sum |probe|^2)
///   counts   ~ Poisson(expected)     (independent per pixel; deterministic given the seed)
///   diffraction = sqrt(counts)       (sqrt scaling: variance-stabilising for Poisson counts)
struct PtychoScan {
  at::Tensor diffraction;      ///< Float [P,1,n,n]: sqrt(counts), the network input
  at::Tensor amplitude;        ///< Float [P,1,n,n]: |object| on the patch, in [0.5,1]
  at::Tensor phase;            ///< Float [P,1,n,n]: arg(object) on the patch, in [-pi/2,pi/2]
  at::Tensor counts;           ///< Float [P,1,n,n]: photon counts (noisy when poisson)
  at::Tensor expected_counts;  ///< Float [P,1,n,n]: the Poisson means (noise-free counts)
  at::Tensor exit_waves;       ///< ComplexFloat [P,n,n]: probe * object patch
  at::Tensor positions;        ///< Long [P,2]: (row, col) of each patch's top-left corner
  at::Tensor probe;            ///< ComplexFloat [n,n]: the same for every task
  at::Tensor object;           ///< ComplexFloat [S,S]: this task's object
  double photon_scale = 0;     ///< expected_counts = photon_scale * fftshift(|FFT2(exit)|^2)
};

/// Simulates the scan of task `task` (>= 0). The object is drawn from (seed, task) only:
/// the same arguments give bit-identical tensors; another task gives another object.
/// Amplitude = 0.5 + 0.5 * f1 and phase = pi * (f2 - 1/2), where f1, f2 are independent
/// smooth fields (each a sum of `blobs` random Gaussians of random sign, centre and width
/// in [S/16, S/4], min-max normalised to [0,1]).
/// @throws RehearsalError for a bad config (patch < 2, object_size < patch, step < 1 or
///         step >= patch, photons <= 0, probe_sigma < 0, blobs < 1) or task < 0.
PtychoScan simulate_ptycho(const PtychoConfig& config, int task, std::uint64_t seed);

/// |FFT2(x)|^2 over the last two dims of a complex tensor, unnormalised DFT and not
/// shifted: by Parseval, its sum over a pattern is n*n times sum |x|^2.
at::Tensor far_field_intensity(const at::Tensor& exit_waves);

/// The weight of each patch pixel in the ptycho-sim error: the probe's intensity
/// |probe|^2 normalised to sum 1 (Float [n,n]). A diffraction pattern carries information
/// about the object only where the probe illuminates it: with the default probe (Gaussian,
/// sigma = n/6) |probe|^2 is below 1 % of its peak on 60 % of the patch.
/// Thread-safe (pure). @throws RehearsalError if `probe` is not a complex [n,n] tensor
/// with some non-zero value.
at::Tensor illumination_weight(const at::Tensor& probe);

/// The ptycho-sim reconstruction error of each sample: for predictions and targets
/// [B,2,n,n] (channel 0 amplitude, channel 1 phase) and `weight` [n,n] from
/// illumination_weight() (any non-negative weight is normalised to sum 1 first), the mean
/// over the two channels of
///   amplitude: sum_r w(r) (a_pred - a_true)^2
///   phase:     min_c sum_r w(r) (phi_pred - phi_true - c)^2
///              = sum_r w(r) (d(r) - dbar)^2,  d = phi_pred - phi_true, dbar = sum_r w(r) d(r)
/// i.e. the probe-weighted mean squared error, with the phase compared up to a constant.
/// A pattern |FFT(probe * O)|^2 is the same for O and O * exp(i c), so a patch's mean phase
/// is not in its data; neither is the object where the probe is dark. Returns Float [B];
/// differentiable (the trainer's loss for ptycho-sim is its mean).
/// Thread-safe (pure). @throws RehearsalError if the shapes do not match.
at::Tensor ptycho_error(const at::Tensor& pred, const at::Tensor& target, const at::Tensor& weight);

}  // namespace diaspora::rehearsal
