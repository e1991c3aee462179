// Diaspora's continual-learning trainer (diaspora-train, docs/rehearsal.md "Trainer"):
// a data-parallel LibTorch job that learns a sequence of tasks from a stream, with a
// rehearsal strategy (incremental, scratch, ER, DER, DER++), the distributed rehearsal
// buffer of rehearsal.hpp, exact checkpoint/resume, and optional reporting through the
// engine plugin's C ABI.
//
// This header is free of LibTorch so that command-line front ends compile cheaply.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/error.hpp"
#include "diaspora/rehearsal_config.hpp"

namespace diaspora::rehearsal {

/// The dataset section (`dataset:`).
struct DatasetConfig {
  std::string name = "fashion-mnist";  ///< "fashion-mnist", "ptycho-sim" or "ptycho-stream"
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int tasks = 5;
  int classes_per_task = 2;        ///< fashion-mnist; tasks * classes_per_task == 10
  std::int64_t train_per_task = 0; ///< 0 = all
  std::int64_t test_per_task = 0;  ///< 0 = all
  int patch = 32;                  ///< ptycho-sim
  int object_size = 128;
  int scan_step = 4;
  double photons = 1e4;
  int test_every = 5;              ///< ptycho-sim: every k-th position is a test pattern
  double probe_drift = 0;          ///< ptycho-sim: scan t's probe curvature is pi * (1 + probe_drift * t)
  // ptycho-stream: scan t is the file announced by the org.diaspora.data.arrived event of
  // stream `stream` with seq t on `topic` of the relay at `relay` (docs/rehearsal.md).
  std::string relay;               ///< wss://HOST:PORT
  std::string topic;
  std::string stream;
  std::string ca_file, token_file;
  std::string scan_dir;            ///< non-empty: only scan files under this folder count
  // Scans announced as data items (diaspora://TOPIC/OFFSET URIs: the workflow's task has
  // output: item) are fetched from the relay into cache_dir (docs/streaming.md).
  std::string item_topic;          ///< non-empty: only items on this topic count
  std::int64_t since_us = 0;       ///< > 0: only items announced at or after this time (µs since the epoch) count
  std::string cache_dir;           ///< where fetched scans are written (default: OUT/scans, beside the job's other output)
  double wait_s = 600;             ///< fail when the next scan does not arrive within this
};

/// The training section (`train:`).
struct TrainConfig {
  int epochs = 1;
  std::int64_t batch_size = 32;
  double lr = 0;                   ///< 0: the optimizer's default (sgd 0.05, adam 0.001)
  std::string optimizer = "sgd";
  double momentum = 0;
  std::string schedule = "constant";  ///< or "cosine": lr to 0 over each task's steps
  std::string augment = "none";       ///< or "shift-flip": the representatives (shift_flip())
  bool logit_adjust = false;          ///< logit-adjusted cross-entropy (er, der, derpp; classification)
  double ema = 0;                  ///< 0: off; else the decay of the evaluated weights' moving average
  int threads = 0;                 ///< 0: hardware threads / ranks
  bool deterministic = true;
  std::int64_t log_every = 50;
};

/// A whole trainer config file: the job plus the rehearsal library's sections.
struct TrainerConfig {
  std::string strategy = "derpp";  ///< incremental | scratch | er | der | derpp
  double alpha = 0.3;
  double beta = 0.5;
  bool weight_align = false;  ///< WA at each task's end (classification; not scratch)
  std::int64_t buffer_size = 500;  ///< over all ranks
  std::uint64_t seed = 0;
  DatasetConfig dataset;
  TrainConfig train;
  std::int64_t checkpoint_every = 0;  ///< steps; 0 = task ends, SIGTERM and actions only
  std::string checkpoint_dir;         ///< empty: OUT/checkpoint
  /// Non-empty: rank 0 also puts each published checkpoint as a data item on this topic
  /// of the relay below (checkpoint.item_topic, docs/rehearsal.md "Checkpoints as data
  /// items"): how a job moves between sites that share no file system (--resume-item).
  std::string checkpoint_item_topic;
  std::string checkpoint_relay, checkpoint_ca_file, checkpoint_token_file;  ///< for checkpoint_item_topic
  std::string plugin_spec;            ///< empty: no plugin
  std::string plugin_task_id = "diaspora-train";
  std::string plugin_site;
  RehearsalConfig rehearsal;          ///< buffer:, insertion:, sampling:

  /// Whether the strategy uses the rehearsal buffer (er, der, derpp).
  bool uses_buffer() const { return strategy == "er" || strategy == "der" || strategy == "derpp"; }
  /// Whether it stores model outputs with the samples (der, derpp).
  bool stores_outputs() const { return strategy == "der" || strategy == "derpp"; }
  /// Whether weight aligning runs at the task ends (weight_align, and not scratch).
  bool aligns_weights() const { return weight_align && strategy != "scratch"; }
  /// Whether the cross-entropy is logit-adjusted (train.logit_adjust, and a buffer).
  bool adjusts_logits() const { return train.logit_adjust && uses_buffer(); }
};

/// Loads a trainer config from YAML text: `overrides` ("key.path=value", as given to
/// --set; the value is read as YAML: 0.1, true, er, [1,2]) are applied first, then the
/// whole document is validated against schemas/rehearsal.schema.json and checked for
/// consistency (e.g. tasks x classes_per_task = 10 for fashion-mnist, patch a multiple
/// of 8). Diagnostics: "FILE:LINE:COL: error: PATH: MESSAGE"; an override's are located
/// at "--set KEY=VALUE".
/// @throws diaspora::SpecError with every diagnostic. Reentrant.
TrainerConfig load_trainer_config_string(std::string_view yaml, std::string_view name = "<string>",
                                         const std::vector<std::string>& overrides = {});
/// As above, reading `file` (at most 1 MiB); relative paths in it (plugin.spec,
/// dataset.dir, checkpoint.dir) are resolved against the file's directory.
/// @throws diaspora::SpecError.
TrainerConfig load_trainer_config_file(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});

/// Exit statuses of diaspora-train (also returned by run_trainer()).
enum TrainExit : int {
  kTrainDone = 0,          ///< every task trained; summary.json written
  kTrainError = 1,         ///< bad config, data, checkpoint or a failed rank
  kTrainUsage = 2,         ///< bad command line
  kTrainCheckpointed = 3,  ///< stopped on request (SIGTERM/SIGINT, checkpoint action, --stop-after) after a checkpoint
  kTrainMigrate = 4,       ///< a migrate action: checkpointed; resume it on the target site with --resume
  kTrainCancelled = 5,     ///< a cancel action: checkpointed and stopped
};

/// How one rank runs.
struct RankOptions {
  std::filesystem::path out;      ///< output directory (rank 0 writes metrics and summary there)
  int rank = 0;
  int world = 1;
  std::string master = "127.0.0.1:0";  ///< HOST:PORT of rank 0's rendezvous store (world > 1)
  std::optional<std::filesystem::path> resume;  ///< a previous OUT or checkpoint dir
  std::int64_t stop_after = 0;    ///< > 0: checkpoint and stop after this many steps of this run
  /// > 0: each background checkpoint's writer waits this long before it serialises the
  /// state it was given (drills and tests: training goes on meanwhile).
  int checkpoint_delay_ms = 0;
  bool progress_bar = false;      ///< draw a progress bar on stderr (rank 0)
  /// Set from a signal handler (SIGTERM/SIGINT): checkpoint at the next step and stop.
  const std::atomic<int>* stop_flag = nullptr;
  /// Set from a signal handler (SIGUSR1): write a checkpoint at the next step and go on
  /// (the trainer clears it). `diaspora run` sends SIGUSR1 for a checkpoint action and
  /// every `checkpoint_every` of a rehearsal job.
  std::atomic<int>* checkpoint_flag = nullptr;
};

/// Writes "diaspora-train: TEXT" and a newline to stderr in one write(2), after flushing
/// std::cerr and stdio's stderr, so that the lines of processes sharing a stderr (the
/// launcher and the ranks it spawns) do not interleave. Any thread; a failed write is
/// ignored (there is nowhere left to report it).
void print_line(std::string_view text);

/// Rank 0's rendezvous address, split.
struct MasterAddress {
  std::string host;
  std::uint16_t port = 0;
};

/// Splits "HOST:PORT" at its last colon: HOST not empty (an IPv6 address in brackets,
/// "[::1]:29500", loses them), PORT a decimal number in 1-65535.
/// `diaspora-train` checks --master with it before anything starts (a bad one is a command
/// line error, status 2); run_trainer() checks RankOptions::master with it again.
/// Any thread. @throws diaspora::Error "--master must be HOST:PORT with a port in 1-65535,
/// not '...'" otherwise.
MasterAddress parse_master_address(std::string_view master);

/// Fetches the checkpoint that a job with checkpoint.item_topic put at `uri`
/// (diaspora://TOPIC/OFFSET, the URI it said on the progress channel) from
/// checkpoint.relay into `root` (a checkpoint folder: its ckpt-STEP folder, then LATEST
/// naming it), and returns `root`, ready for RankOptions::resume. While the relay is away
/// it is tried every second for `patience_s`. Nothing is left in `root` unless the whole
/// item arrived with its checksum and its files add up.
/// @throws RehearsalError (from diaspora/rehearsal.hpp) for a URI that is not one, no
/// relay settings, an item that is not a checkpoint, a relay that refuses or stays away, a
/// file that cannot be written.
/// @par Thread Safety
/// Any thread; before the ranks start (diaspora-train --resume-item).
std::filesystem::path fetch_checkpoint_item(const TrainerConfig& config, const std::string& uri,
                                            const std::filesystem::path& root, double patience_s = 60);

/// Runs one rank of a training job to its end, a requested stop, or an error. All
/// ranks of a job run it with the same config; they meet in collectives every step.
/// Writes OUT/metrics.jsonl, OUT/summary.json and OUT/curves.png (rank 0) and
/// checkpoints under the checkpoint dir. Returns a TrainExit status; errors are printed
/// on stderr ("diaspora-train: rank R: ...") and return kTrainError.
/// @par Thread Safety
/// One call per process (it sets LibTorch's thread count and seeds).
int run_trainer(const TrainerConfig& config, const RankOptions& options);

}  // namespace diaspora::rehearsal
