// The relay's durable topic log (see topic_log.hpp for the thread model).
//
// On disk, under data_dir:
//   topics/<topic>/<base offset, 20 digits zero-padded>.log   segments, oldest first
//   groups/<group>.json                                       consumer-group offsets
//   .lock                                                     flock()ed: one LogStore per data_dir
//
// Records: log_record.hpp (a storage frame with offset, time, producer, seq and dedupe key).
// Event de-dupe: dedupe.hpp. Consumer groups: consumer_groups.hpp. This file holds the
// topics, their segments, recovery, retention and the commit pipeline.
//
// Concurrency:
//   * queue_mu_ guards the append queue; the writer thread takes everything queued at once.
//   * write_mu_ is held by the writer while it encodes and writes a group and by
//     enforce_retention(), so only one of them changes the writer-only fields at a time.
//   * Commit pipeline (fsync always): the writer hands each written group to pipe_mu_'s
//     queue; three syncer threads each take every group not yet being synced, fdatasync the
//     files they wrote, and reveal and complete ready groups strictly in order. A group
//     written while another's sync runs starts its own sync at once (the disk serves both),
//     which halves the wait for an ack compared with one sync after another, and a sync
//     that returns vouches for the earlier groups of the files it synced, so one slow
//     fdatasync does not hold back the acks behind it (syncer_loop). Interval
//     mode syncs on one syncer thread, off the writer's path; never mode reveals at once.
//   * Topic::mu guards what readers see: the segment list, each segment's committed size and
//     index, and the committed next offset. Readers copy shared_ptrs of the segments under
//     it, then pread() without it; a segment deleted by retention meanwhile stays readable
//     through its open fd until the last reader drops it.
//   * topics_mu_ guards the topic map; topics are never removed, so Topic* stays valid.
#include "topic_log.hpp"

#include "consumer_groups.hpp"
#include "dedupe.hpp"
#include "diaspora/event.hpp"  // now_us
#include "diaspora/files.hpp"
#include "diaspora/thread_name.hpp"
#include "log_record.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <new>
#include <shared_mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace diaspora::relay {

namespace fs = std::filesystem;
using storage::errno_text;
using storage::fsync_dir;
using storage::pwrite_all;

namespace {

constexpr auto kRetentionPeriod = std::chrono::seconds(5);
constexpr std::size_t kRecoveryWindow = 1u << 20;       // read-ahead when scanning a whole segment
constexpr std::string_view kSegmentExt = ".log";

void log_line(const std::string& line) {
  // One fprintf per line so lines from concurrent threads do not interleave.
  std::fprintf(stderr, "diaspora-relay: log: %s\n", line.c_str());
}

std::string segment_name(std::uint64_t base) { return storage::segment_name(base, kSegmentExt); }

struct IndexEntry {
  std::uint64_t offset;
  std::uint64_t pos;
};

constexpr int kMaxSyncers = 3;  // syncer threads with fsync always (Segment::sync_fds)

struct Segment {
  std::uint64_t base = 0;
  fs::path path;
  int fd = -1;  // set before the segment is published, then constant until destruction
  // fsync always: one more descriptor of the file per syncer, opened with `fd` (before any
  // write), so that a writeback error is reported to every syncer's fdatasync, not only to
  // whichever asks first (Linux reports an error once per open file description). That
  // lets a later sync that succeeded vouch for the earlier writes it covered.
  int sync_fds[kMaxSyncers] = {-1, -1, -1};
  // Guarded by LogStore::Impl::pipe_mu_ (fsync always): a segment that takes no more
  // writes (sealed: the topic rolled to a newer one) closes its sync_fds once no group in
  // the pipeline wrote to it and no sync of it runs, so a retained log keeps one
  // descriptor per segment.
  int pipeline_groups = 0;
  int syncs_running = 0;
  bool sealed = false;

  // Guarded by Topic::mu.
  std::uint64_t committed_size = 0;
  std::vector<IndexEntry> index;
  std::int64_t max_time_us = INT64_MIN;  // newest record; INT64_MIN while empty

  // Writer-only (under write_mu_).
  std::uint64_t written_size = 0;
  std::uint64_t last_index_pos = 0;
  bool has_index = false;
  bool tail_dirty = false;  // a rollback's ftruncate failed: retry before the next write

  // Guarded by LogStore::Impl::pipe_mu_ (interval mode: queued for the next sync).
  bool sync_pending = false;

  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() {
    if (fd >= 0) ::close(fd);
    close_sync_fds();
  }
  void close_sync_fds() noexcept {
    for (int& f : sync_fds)
      if (f >= 0) {
        ::close(f);
        f = -1;
      }
  }
  /// Closes sync_fds when they can no longer be used (see pipeline_groups). Under pipe_mu_.
  void maybe_close_sync_fds() noexcept {
    if (sealed && pipeline_groups == 0 && syncs_running == 0) close_sync_fds();
  }
  /// Opens sync_fds (fsync always); false with errno set when the file cannot be opened.
  bool open_sync_fds(int n) {
    for (int i = 0; i < n; ++i)
      if ((sync_fds[i] = ::open(path.c_str(), O_RDONLY | O_CLOEXEC)) < 0) return false;
    return true;
  }
};


struct Topic {
  std::string name;
  fs::path dir;

  mutable std::mutex mu;
  // Guarded by mu.
  std::vector<std::shared_ptr<Segment>> segments;
  std::uint64_t committed_next = 0;
  std::uint64_t bytes = 0;

  // Writer-only (under write_mu_). The writer finds its segment through `active`, never
  // through `segments` (which a syncer extends under mu when it reveals a group).
  std::uint64_t next_offset = 0;
  std::unordered_map<std::string, std::uint64_t> producer_seqs;
  // Producers whose last seq was found on disk by recovery: a crash may have cut that
  // batch short (a torn tail keeps a prefix of its records), so a resend of it is
  // completed through the key de-dupe instead of being dropped whole.
  std::unordered_set<std::string> maybe_torn;
  // Per producer, the seqs of its batches that could not be written (a full disk) or were
  // refused for coming after one that could not: while any is unwritten, the producer's
  // batches after the lowest are refused too. A batch written after a failed one would
  // make the failed one's resend look like a duplicate (seq at or below the last written:
  // its events lost) and put its events out of the producer's order; a stale batch of a
  // dead connection, still queued, must not slip in once the failed one is written either
  // (found writing the chaos tests and by their history checker, tests/chaos/). In memory: after a
  // restart the high-water marks read from the log are below every unwritten batch.
  std::unordered_map<std::string, std::set<std::uint64_t>> unwritten;
  KeyWindow keys;  // (source, id) fingerprints of the last dedupe_window events
  // Where the next record goes: the last segment, or a newer one not yet revealed to
  // readers while the group that created it waits for its sync.
  std::shared_ptr<Segment> active;

  // Set (once, by a syncer) when an fdatasync of one of its segments failed: after that the
  // page cache may hold data the disk lost, so the topic takes no more writes until a
  // restart, whose recovery verifies every record.
  std::atomic<bool> broken{false};
  std::string broken_why;  // written before `broken` is set, read after it is seen

  void remember_key(std::string_view key, std::size_t window) { keys.remember(fingerprint(key), window); }
};

struct Pending {
  std::string topic;
  std::string producer;
  std::uint64_t seq = 0;
  std::vector<AppendRecord> records;
  LogStore::Completion done;
};

/// What one group commit writes to one segment file.
struct Chunk {
  std::shared_ptr<Segment> seg;
  bool created = false;   // a new segment file (roll or first segment)
  bool attempted = false; // the file was touched, so a failure must undo it
  std::uint64_t start = 0;
  WriteBuffer buf;        // the records; handed back for reuse once written
  std::uint64_t len = 0;  // bytes written at start (buf.size() until then)
  std::vector<IndexEntry> index;
  std::uint64_t last_index_pos = 0;
  bool has_index = false;
  std::int64_t max_time_us = INT64_MIN;
};

/// One topic's share of a group commit; nothing reaches readers until reveal().
struct TopicWork {
  Topic* topic = nullptr;
  std::vector<std::size_t> batches;  // indexes into the group
  std::vector<std::size_t> to_finish; // batches whose outcome depends on the write
  std::vector<Chunk> chunks;
  std::uint64_t next = 0;
  std::unordered_map<std::string_view, std::uint64_t> seq_overlay;
  std::vector<std::pair<std::string_view, std::uint64_t>> producer_batches;  // (producer, seq) of each batch to write
  std::vector<Fingerprint> new_keys;  // keys this group remembered; forgotten again on rollback
  std::vector<Fingerprint> batch_keys;  // scratch: the current batch's fingerprints, in order
  bool rolled = false;
  bool advanced = false;  // written, and the writer's state moved past it
  bool failed = false;
  std::string error;
  const char* code = "storage_error";  // AppendResult::code of its failed batches
};

// Unwritten seqs remembered per producer (Topic::unwritten): a producer that never sends
// its failed batch again is refused anyway; the bound only caps the memory it can take.
constexpr std::size_t kMaxUnwritten = 4096;

const std::vector<double> kFsyncBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                          0.025,  0.05,    0.1,    0.25,  0.5,   1};

}  // namespace

FsyncPolicy FsyncPolicy::parse(std::string_view text) {
  FsyncPolicy p;
  if (text == "always") return p;
  if (text == "never") {
    p.mode = Mode::never;
    return p;
  }
  constexpr std::string_view prefix = "interval:";
  if (text.substr(0, prefix.size()) == prefix && text.size() > prefix.size()) {
    std::uint32_t ms = 0;
    const char* first = text.data() + prefix.size();
    const char* last = text.data() + text.size();
    auto [end, ec] = std::from_chars(first, last, ms);
    if (ec == std::errc() && end == last) {
      p.mode = Mode::interval;
      p.interval = std::chrono::milliseconds(ms);
      return p;
    }
  }
  throw Error("bad fsync policy '" + std::string(text) + "': use always, never or interval:<ms>");
}

struct LogStore::Impl {
  explicit Impl(LogOptions options);
  ~Impl();

  /// One group commit: what the writer took from the queue at once, from its write to the
  /// completions. With fsync always it waits in pipeline_ for a sync that started after
  /// its write; groups are revealed and completed strictly in order.
  struct Group {
    std::vector<Pending> batches;
    std::vector<AppendResult> results;
    std::map<std::string_view, TopicWork> work;  // keys view batches[i].topic
    std::shared_ptr<const CommitListener> listener;
    std::vector<std::shared_ptr<Segment>> segs;  // fsync always: the files it wrote (to sync)
    bool sync_started = false;
    bool synced = false;
  };

  // ---- writer ----
  void writer_loop();
  std::optional<std::chrono::steady_clock::time_point> next_wakeup() const;
  void run_group(std::vector<Pending>& batches, const std::shared_ptr<const CommitListener>& listener);
  void process_locked(Group& g);
  void finish(Group& g);
  void encode(TopicWork& w, std::vector<Pending>& batches, std::vector<AppendResult>& results);
  bool completes_torn_batch(const Topic& t, const TopicWork& w, const Pending& b, std::uint64_t last) const;
  Chunk& chunk_for(TopicWork& w, std::size_t size, std::uint64_t offset);
  WriteBuffer take_buffer();
  void recycle(TopicWork& w);
  std::vector<WriteBuffer> spare_buffers_;  // writer-only: chunk buffers kept for the next group
  void write(TopicWork& w);
  void rollback(TopicWork& w, const std::string& why);
  void advance(TopicWork& w);
  void reveal(TopicWork& w);
  int timed_fdatasync(int fd);

  // ---- syncers (fsync always: three, so a group's sync starts while the previous one's runs;
  //      interval: one, off the writer's path; never: none) ----
  void syncer_loop(int index);
  void interval_syncer_loop();
  void commit_ready(std::unique_lock<std::mutex>& lk);
  bool has_unclaimed() const;
  Topic* get_or_create_topic(const std::string& name, std::string& error, const char*& code);
  void enforce_retention_locked();
  Retention default_retention() const noexcept { return Retention{opt_.retention_bytes, opt_.retention_age}; }

  // ---- recovery and lookup ----
  void recover_topic(const std::string& name);
  Topic* find_topic(const std::string& name) const;
  std::vector<Topic*> all_topics() const;

  LogOptions opt_;
  fs::path topics_dir_;
  fs::path groups_dir_;
  storage::Fd lock_;

  mutable std::shared_mutex topics_mu_;
  std::map<std::string, std::unique_ptr<Topic>> topics_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<Pending> queue_;
  bool stop_ = false;
  std::shared_ptr<const CommitListener> listener_;  // guarded by queue_mu_

  std::mutex write_mu_;

  mutable std::mutex stats_mu_;
  FsyncStats stats_;

  std::unique_ptr<ConsumerGroups> groups_;

  // Writer-thread only.
  std::chrono::steady_clock::time_point last_retention_;

  // The commit pipeline, guarded by pipe_mu_.
  std::mutex pipe_mu_;
  std::condition_variable pipe_cv_;  // syncers: a group to sync, dirty segments, or stop
  std::condition_variable room_cv_;  // writer: room in the pipeline
  std::deque<std::shared_ptr<Group>> pipeline_;
  bool committing_ = false;  // one thread at a time reveals and completes, in order
  bool pipe_stop_ = false;
  std::vector<std::shared_ptr<Segment>> dirty_;  // interval mode: written, not yet synced
  static constexpr std::size_t kMaxGroupsInFlight = 8;
  // fsync always. With vouching, 3 beat 2 on the p99 at 20k events/s (median p99 over 10
  // runs each 2.9 vs 3.2 ms, a slow-disk hour) at the same throughput; without vouching a
  // third syncer gave nothing.
  static constexpr int kSyncers = 3;
  static_assert(kSyncers <= kMaxSyncers);

  std::thread writer_;
  std::vector<std::thread> syncers_;
};

LogStore::Impl::Impl(LogOptions options) : opt_(std::move(options)) {
  if (opt_.data_dir.empty()) throw Error("log data directory not set");
  if (opt_.segment_bytes == 0) throw Error("segment_bytes must be positive");
  topics_dir_ = opt_.data_dir / "topics";
  groups_dir_ = opt_.data_dir / "groups";
  std::error_code ec;
  fs::create_directories(topics_dir_, ec);
  if (!ec) fs::create_directories(groups_dir_, ec);
  if (ec) throw Error("cannot create log directory under " + opt_.data_dir.string() + ": " + ec.message());

  // Two relays appending to one directory would interleave offsets and corrupt segments.
  int err = 0;
  lock_ = storage::lock_directory(opt_.data_dir, err);
  if (err == EWOULDBLOCK)
    throw Error("log directory " + opt_.data_dir.string() + " is in use by another process (" + errno_text(err) + ")");
  if (err) throw Error("cannot lock " + (opt_.data_dir / ".lock").string() + ": " + errno_text(err));

  stats_.bucket_bounds = kFsyncBounds;
  stats_.bucket_counts.assign(kFsyncBounds.size(), 0);

  try {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(topics_dir_)) {
      if (!e.is_directory()) continue;
      std::string name = e.path().filename().string();
      if (!valid_topic_name(name)) {
        log_line("ignoring " + e.path().string() + ": not a valid topic name");
        continue;
      }
      names.push_back(std::move(name));
    }
    for (const auto& n : names) recover_topic(n);
    groups_ = std::make_unique<ConsumerGroups>(groups_dir_, opt_.max_groups, log_line);
  } catch (const fs::filesystem_error& e) {
    throw Error(std::string("cannot read log directory: ") + e.what());
  }

  last_retention_ = std::chrono::steady_clock::now();
  writer_ = std::thread([this] {
    name_this_thread("relay-writer");
    writer_loop();
  });
  if (opt_.fsync.mode == FsyncPolicy::Mode::always)
    for (int i = 0; i < kSyncers; ++i) syncers_.emplace_back([this, i] {
      name_this_thread("relay-sync");
      syncer_loop(i);
    });
  else if (opt_.fsync.mode == FsyncPolicy::Mode::interval)
    syncers_.emplace_back([this] {
      name_this_thread("relay-sync");
      interval_syncer_loop();
    });
}

LogStore::Impl::~Impl() {
  {
    std::lock_guard lk(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_one();
  if (writer_.joinable()) writer_.join();  // every queued batch is written (or failed) now
  {
    std::lock_guard lk(pipe_mu_);
    pipe_stop_ = true;
  }
  pipe_cv_.notify_all();
  for (auto& t : syncers_) t.join();  // ... and synced, revealed and completed
}

// ---------------------------------------------------------------------------------------
// Recovery

void LogStore::Impl::recover_topic(const std::string& name) {
  auto t = std::make_unique<Topic>();
  t->name = name;
  t->dir = topics_dir_ / name;

  const auto files = storage::list_segments(t->dir, kSegmentExt);

  std::optional<std::uint64_t> last_offset;
  std::string last_producer;  // of the last record: only its batch can have lost a tail
  for (std::size_t i = 0; i < files.size(); ++i) {
    auto seg = std::make_shared<Segment>();
    seg->base = files[i].first;
    seg->path = files[i].second;
    seg->fd = ::open(seg->path.c_str(), O_RDWR | O_CLOEXEC);
    if (seg->fd < 0) throw Error("cannot open segment " + seg->path.string() + ": " + errno_text(errno));
    struct stat st {};
    if (::fstat(seg->fd, &st) != 0) throw Error("cannot stat " + seg->path.string() + ": " + errno_text(errno));
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t next_base = i + 1 < files.size() ? files[i + 1].first : UINT64_MAX;

    RecordScanner sc(seg->fd, 0, size, kRecoveryWindow);
    std::uint64_t expected = seg->base;
    std::uint64_t good_end = 0;
    std::string reason;
    for (;;) {
      const auto status = sc.next();
      if (status == RecordScanner::Status::end) break;
      if (status == RecordScanner::Status::io_error)
        throw Error("cannot read segment " + seg->path.string() + ": " + sc.reason());
      if (status == RecordScanner::Status::bad) {
        reason = sc.reason();
        break;
      }
      const RecordView& r = sc.record();
      if (r.offset != expected) {
        reason = "offset " + std::to_string(r.offset) + " where " + std::to_string(expected) + " was expected";
        break;
      }
      if (r.offset >= next_base) {
        reason = "offset " + std::to_string(r.offset) + " reaches the next segment's base";
        break;
      }
      const std::uint64_t pos = sc.record_pos();
      if (!seg->has_index || pos - seg->last_index_pos >= opt_.index_interval_bytes) {
        seg->index.push_back({r.offset, pos});
        seg->last_index_pos = pos;
        seg->has_index = true;
      }
      seg->max_time_us = std::max(seg->max_time_us, r.time_us);
      if (!r.producer.empty()) {
        auto [it, inserted] = t->producer_seqs.try_emplace(std::string(r.producer), r.seq);
        if (!inserted) it->second = std::max(it->second, r.seq);
      }
      last_producer.assign(r.producer);
      if (!r.key.empty()) t->remember_key(r.key, opt_.dedupe_window);
      last_offset = r.offset;
      ++expected;
      good_end = sc.pos();
    }
    if (!reason.empty()) {
      // Everything from the first bad record on is unreachable: offsets must stay
      // consecutive and a torn tail is what an interrupted write leaves.
      if (::ftruncate(seg->fd, static_cast<off_t>(good_end)) != 0 || ::fsync(seg->fd) != 0)
        throw Error("cannot truncate damaged segment " + seg->path.string() + ": " + errno_text(errno));
      log_line("recovery: truncated " + seg->path.string() + " at byte " + std::to_string(good_end) + " of " +
               std::to_string(size) + " (" + reason + ")");
    }
    seg->committed_size = seg->written_size = good_end;
    t->bytes += good_end;
    t->segments.push_back(std::move(seg));
  }

  if (!last_producer.empty()) t->maybe_torn.insert(last_producer);
  std::uint64_t next = last_offset ? *last_offset + 1 : 0;
  // An empty last segment (e.g. created just before a crash, or truncated to nothing)
  // fixes the next offset at its base so that segment names stay ordered.
  if (!t->segments.empty()) next = std::max(next, t->segments.back()->base);
  if (!t->segments.empty()) {
    t->active = t->segments.back();
    // Only the segment that takes writes needs the syncers' descriptors.
    if (opt_.fsync.mode == FsyncPolicy::Mode::always && !t->active->open_sync_fds(kSyncers))
      throw Error("cannot open segment " + t->active->path.string() + ": " + errno_text(errno));
  }
  t->next_offset = t->committed_next = next;
  topics_.emplace(name, std::move(t));
}

Topic* LogStore::Impl::find_topic(const std::string& name) const {
  std::shared_lock lk(topics_mu_);
  auto it = topics_.find(name);
  return it == topics_.end() ? nullptr : it->second.get();
}

std::vector<Topic*> LogStore::Impl::all_topics() const {
  std::shared_lock lk(topics_mu_);
  std::vector<Topic*> out;
  out.reserve(topics_.size());
  for (const auto& [name, t] : topics_) out.push_back(t.get());
  return out;
}

// ---------------------------------------------------------------------------------------
// Writer

std::optional<std::chrono::steady_clock::time_point> LogStore::Impl::next_wakeup() const {
  if (any_bounded(opt_.retention_by_topic, default_retention())) return last_retention_ + kRetentionPeriod;
  return std::nullopt;
}

void LogStore::Impl::writer_loop() {
  for (;;) {
    std::vector<Pending> batches;
    std::shared_ptr<const CommitListener> listener;
    bool exiting = false;
    {
      std::unique_lock lk(queue_mu_);
      auto ready = [&] { return stop_ || !queue_.empty(); };
      if (auto at = next_wakeup())
        queue_cv_.wait_until(lk, *at, ready);
      else
        queue_cv_.wait(lk, ready);
      exiting = stop_ && queue_.empty();
      batches.swap(queue_);
      listener = listener_;
    }
    if (!batches.empty()) run_group(batches, listener);

    const auto now = std::chrono::steady_clock::now();
    if (any_bounded(opt_.retention_by_topic, default_retention()) && now >= last_retention_ + kRetentionPeriod) {
      std::lock_guard wl(write_mu_);
      enforce_retention_locked();
      last_retention_ = now;
    }
    if (exiting) return;
  }
}

void LogStore::Impl::run_group(std::vector<Pending>& batches, const std::shared_ptr<const CommitListener>& listener) {
  auto g = std::make_shared<Group>();
  g->batches = std::move(batches);
  g->results.resize(g->batches.size());
  g->listener = listener;
  {
    std::lock_guard wl(write_mu_);
    try {
      process_locked(*g);
    } catch (const std::exception& e) {
      // Only reachable on allocation failure and the like: fail whatever is not settled
      // rather than let the writer thread die with batches never completed. Topics already
      // written go on (the writer's state has moved past them).
      log_line(std::string("writer: ") + e.what());
      for (auto& r : g->results)
        if (!r.ok && r.error.empty()) r.error = std::string("internal error: ") + e.what();
      for (auto& [name, w] : g->work)
        if (!w.advanced && !w.failed) {
          w.failed = true;
          w.error = std::string("internal error: ") + e.what();
        }
    }
  }
  if (opt_.fsync.mode != FsyncPolicy::Mode::always) return finish(*g);

  // Queued behind the groups still syncing (acks must keep their order); a group with
  // nothing to sync (duplicates, refusals) is ready at once.
  for (const auto& [name, w] : g->work)
    if (!w.failed)
      for (const Chunk& c : w.chunks)
        if (c.len > 0 && std::find(g->segs.begin(), g->segs.end(), c.seg) == g->segs.end()) g->segs.push_back(c.seg);
  const bool nothing_to_sync = g->segs.empty();
  std::unique_lock lk(pipe_mu_);
  room_cv_.wait(lk, [&] { return pipeline_.size() < kMaxGroupsInFlight; });
  for (const auto& seg : g->segs) ++seg->pipeline_groups;
  g->synced = g->sync_started = nothing_to_sync;
  pipeline_.push_back(std::move(g));
  if (nothing_to_sync) commit_ready(lk);
  else pipe_cv_.notify_one();
}

bool LogStore::Impl::has_unclaimed() const {
  for (const auto& g : pipeline_)
    if (!g->sync_started) return true;
  return false;
}

// fsync always: takes every written group not yet being synced, syncs each segment they
// wrote (one fdatasync per file covers them all), then reveals whatever is ready in order.
// With several of these a group written while another group's sync runs starts its own sync
// at once instead of waiting for that one to finish (the disk serves both in parallel).
//
// A sync also vouches for the groups ahead of its own that are still waiting for theirs:
// they were written before it started, so when it succeeds on every segment such a group
// wrote, that group is on stable storage too (fdatasync covers all of a file's data written
// before the call, including pages another sync is still writing back). So one slow
// fdatasync does not hold back the acks of groups whose later sync already returned. Each
// syncer syncs through its own descriptor (Segment::sync_fds), so a writeback error is
// reported to it as well and a success really means the data is durable.
void LogStore::Impl::syncer_loop(int index) {
  std::unique_lock lk(pipe_mu_);
  for (;;) {
    pipe_cv_.wait(lk, [&] { return pipe_stop_ || has_unclaimed(); });
    if (!has_unclaimed()) return;  // stopping, and every group is claimed
    std::vector<std::shared_ptr<Group>> mine;
    std::vector<std::shared_ptr<Segment>> segs;
    for (auto& g : pipeline_) {
      if (g->sync_started) continue;
      g->sync_started = true;
      mine.push_back(g);
      for (const auto& seg : g->segs)
        if (std::find(segs.begin(), segs.end(), seg) == segs.end()) segs.push_back(seg);
    }
    for (const auto& seg : segs) ++seg->syncs_running;  // its sync_fds stay open meanwhile
    lk.unlock();
    std::vector<std::pair<const Segment*, std::string>> failed;
    std::vector<std::shared_ptr<Segment>> vouched;  // synced through this syncer's own descriptor
    for (const auto& seg : segs) {
      const bool own = seg->sync_fds[index] >= 0;
      if (own) vouched.push_back(seg);
      if (int err = timed_fdatasync(own ? seg->sync_fds[index] : seg->fd))
        failed.emplace_back(seg.get(), "cannot sync " + seg->path.string() + ": " + errno_text(err));
    }
    lk.lock();
    for (const auto& seg : segs) {
      --seg->syncs_running;
      seg->maybe_close_sync_fds();
    }
    for (const auto& g : mine) {
      g->synced = true;
      // finish() fails every batch of a broken topic that it has not revealed yet.
      for (const auto& [seg, why] : failed)
        for (auto& [name, w] : g->work)
          for (const Chunk& c : w.chunks)
            if (c.seg.get() == seg && !w.failed && !w.topic->broken.load(std::memory_order_acquire)) {
              w.topic->broken_why = why;
              w.topic->broken.store(true, std::memory_order_release);
              log_line("topic '" + w.topic->name + "' takes no more writes until a restart: " + why);
            }
    }
    if (failed.empty())
      for (const auto& g : pipeline_) {
        if (g == mine.front()) break;  // only groups written before this sync started
        if (g->synced || !g->sync_started) continue;
        // Only through descriptors of its own: a shared one may have reported an error to
        // another syncer only.
        g->synced = std::all_of(g->segs.begin(), g->segs.end(), [&](const std::shared_ptr<Segment>& seg) {
          return std::find(vouched.begin(), vouched.end(), seg) != vouched.end();
        });
      }
    commit_ready(lk);
  }
}

// Reveals and completes, in order, every group at the head of the pipeline whose sync is
// done. One thread at a time (committing_); pipe_mu_ is released around each group.
void LogStore::Impl::commit_ready(std::unique_lock<std::mutex>& lk) {
  if (committing_) return;  // that thread will see what became ready meanwhile
  committing_ = true;
  while (!pipeline_.empty() && pipeline_.front()->synced) {
    std::shared_ptr<Group> g = std::move(pipeline_.front());
    pipeline_.pop_front();
    for (const auto& seg : g->segs) {
      --seg->pipeline_groups;
      seg->maybe_close_sync_fds();
    }
    room_cv_.notify_one();
    lk.unlock();
    finish(*g);
    lk.lock();
  }
  committing_ = false;
}

void LogStore::Impl::interval_syncer_loop() {
  std::unique_lock lk(pipe_mu_);
  for (;;) {
    const bool stopping = pipe_cv_.wait_for(lk, opt_.fsync.interval, [&] { return pipe_stop_; });
    std::vector<std::shared_ptr<Segment>> segs;
    segs.swap(dirty_);
    for (const auto& seg : segs) seg->sync_pending = false;
    lk.unlock();
    // Interval mode has acked these records already; a failure can only be reported.
    for (const auto& seg : segs)
      if (int err = timed_fdatasync(seg->fd)) log_line("cannot sync " + seg->path.string() + ": " + errno_text(err));
    lk.lock();
    if (stopping && dirty_.empty()) return;
  }
}

// Encodes and writes every batch of the group, topic by topic, and moves the writer's own
// state past them (advance). Readers see nothing yet: finish() reveals the group.
void LogStore::Impl::process_locked(Group& g) {
  std::vector<Pending>& batches = g.batches;
  std::vector<AppendResult>& results = g.results;
  auto& work = g.work;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    if (!valid_topic_name(batches[i].topic)) {
      results[i].error = "invalid topic name";
      continue;
    }
    work[batches[i].topic].batches.push_back(i);
  }

  bool rolled = false;
  for (auto& [name, w] : work) {
    try {
      std::string error;
      w.topic = get_or_create_topic(std::string(name), error, w.code);
      if (w.topic && w.topic->broken.load(std::memory_order_acquire))
        error = "topic '" + w.topic->name + "' takes no writes until the relay restarts (" + w.topic->broken_why + ")";
      if (!w.topic || !error.empty()) {
        w.failed = true;
        w.error = error;
        w.to_finish = w.batches;
        continue;
      }
      encode(w, batches, results);
      write(w);
      if (!w.failed) {
        advance(w);
        rolled = rolled || w.rolled;
      }
    } catch (const std::exception& e) {
      // Settle every batch of the topic that passed validation, encoded or not yet.
      w.to_finish.clear();
      for (std::size_t i : w.batches)
        if (results[i].error.empty()) w.to_finish.push_back(i);
      const std::string why = std::string("internal error: ") + e.what();
      if (w.topic) {
        rollback(w, why);
      } else {
        w.failed = true;
        w.error = why;
      }
    }
  }
  if (rolled && any_bounded(opt_.retention_by_topic, default_retention())) enforce_retention_locked();
}

// Makes a written (and, with fsync always, synced) group visible to readers and runs its
// completions and the commit listener. No lock is held on entry.
void LogStore::Impl::finish(Group& g) {
  std::vector<std::pair<std::string, std::uint64_t>> notify;
  for (auto& [name, w] : g.work) {
    if (!w.failed && w.topic->broken.load(std::memory_order_acquire)) {  // written after a failed sync
      w.failed = true;
      w.error = w.topic->broken_why;
    }
    if (w.failed) {
      for (std::size_t i : w.to_finish) {
        g.results[i] = AppendResult{};
        g.results[i].error = w.error;
        g.results[i].code = w.code;
      }
      continue;
    }
    reveal(w);
    for (std::size_t i : w.to_finish) g.results[i].ok = true;
    notify.emplace_back(std::string(name), w.next);
  }
  // Outside every lock of the store, so a completion may call back into it.
  for (std::size_t i = 0; i < g.batches.size(); ++i) {
    if (!g.batches[i].done) continue;
    try {
      g.batches[i].done(g.results[i]);
    } catch (const std::exception& e) {
      log_line(std::string("append completion threw: ") + e.what());
    } catch (...) {
      log_line("append completion threw");
    }
  }
  if (g.listener && *g.listener) {
    for (const auto& [topic, next] : notify) {
      try {
        (*g.listener)(topic, next);
      } catch (...) {
        log_line("commit listener threw");
      }
    }
  }
}

Topic* LogStore::Impl::get_or_create_topic(const std::string& name, std::string& error, const char*& code) {
  if (Topic* t = find_topic(name)) return t;
  {
    std::shared_lock lk(topics_mu_);
    if (topics_.size() >= opt_.max_topics) {
      code = "too_many_topics";
      error = "the relay keeps at most " + std::to_string(opt_.max_topics) +
              " topics (limits.max_topics) and has as many: publish to a topic that exists, or raise the limit";
      return nullptr;
    }
  }
  auto t = std::make_unique<Topic>();
  t->name = name;
  t->dir = topics_dir_ / name;
  std::error_code ec;
  fs::create_directory(t->dir, ec);
  if (ec) {
    error = "cannot create topic directory " + t->dir.string() + ": " + ec.message();
    return nullptr;
  }
  if (int err = fsync_dir(topics_dir_)) {
    error = "cannot sync " + topics_dir_.string() + ": " + errno_text(err);
    return nullptr;
  }
  std::unique_lock lk(topics_mu_);
  return topics_.emplace(name, std::move(t)).first->second.get();
}

// A batch with the producer's last seq is normally a duplicate. After a crash, though,
// recovery may have kept only a prefix of it; when every event carries a de-dupe key the
// resend is let through and the key window drops the events already stored, so the rest
// lands right after them, in order, and nothing is written twice.
bool LogStore::Impl::completes_torn_batch(const Topic& t, const TopicWork& w, const Pending& b,
                                          std::uint64_t last) const {
  if (b.seq != last || opt_.dedupe_window == 0 || t.maybe_torn.empty()) return false;
  if (w.seq_overlay.contains(b.producer) || !t.maybe_torn.contains(b.producer)) return false;
  return std::all_of(b.records.begin(), b.records.end(), [](const AppendRecord& r) { return !r.dedupe_key.empty(); });
}

void LogStore::Impl::encode(TopicWork& w, std::vector<Pending>& batches, std::vector<AppendResult>& results) {
  Topic& t = *w.topic;
  w.next = t.next_offset;
  for (std::size_t i : w.batches) {
    Pending& b = batches[i];
    AppendResult& r = results[i];

    // Validate the whole batch first: it is written entirely or not at all.
    if (b.producer.size() > kMaxFieldBytes) {
      r.error = "producer id longer than " + std::to_string(kMaxFieldBytes) + " bytes";
      continue;
    }
    for (const auto& rec : b.records) {
      if (rec.dedupe_key.size() > kMaxFieldBytes) {
        r.error = "dedupe key longer than " + std::to_string(kMaxFieldBytes) + " bytes";
        break;
      }
      if (record_size(b.producer, rec.dedupe_key, rec.payload) > kMaxRecordBytes) {
        r.error = "record larger than " + std::to_string(kMaxRecordBytes) + " bytes";
        break;
      }
    }
    if (!r.error.empty()) continue;

    if (!b.producer.empty() && !t.unwritten.empty()) {
      if (auto f = t.unwritten.find(b.producer); f != t.unwritten.end() && b.seq > *f->second.begin()) {
        r.error = "batch " + std::to_string(b.seq) + " of producer '" + b.producer + "' comes after its batch " +
                  std::to_string(*f->second.begin()) + ", which could not be written: send again from that batch";
        if (f->second.size() < kMaxUnwritten) f->second.insert(b.seq);
        continue;
      }
    }

    w.to_finish.push_back(i);
    r.first_offset = w.next;
    if (!b.producer.empty()) {
      std::optional<std::uint64_t> last;
      if (auto o = w.seq_overlay.find(b.producer); o != w.seq_overlay.end())
        last = o->second;
      else if (auto s = t.producer_seqs.find(b.producer); s != t.producer_seqs.end())
        last = s->second;
      if (last && b.seq <= *last && !completes_torn_batch(t, w, b, *last)) {
        r.duplicate_batch = true;
        continue;
      }
      w.seq_overlay[b.producer] = b.seq;
      w.producer_batches.emplace_back(b.producer, b.seq);
    }

    const std::int64_t time = now_us();
    if (!w.chunks.empty()) {  // grow the buffer once per batch, not by doubling per record
      std::size_t need = 0;
      for (const auto& rec : b.records) need += record_size(b.producer, rec.dedupe_key, rec.payload);
      w.chunks.back().buf.reserve(w.chunks.back().buf.size() + need);
    }
    // The de-dupe table is far larger than the caches: hash the whole batch first and
    // prefetch the slots it will probe (and those of the keys it will expire), so the
    // misses overlap instead of costing one memory round trip per event in turn.
    w.batch_keys.clear();
    if (opt_.dedupe_window > 0) {
      for (const auto& rec : b.records)
        w.batch_keys.push_back(rec.dedupe_key.empty() ? Fingerprint{} : fingerprint(rec.dedupe_key));
      t.keys.prefetch(w.batch_keys, opt_.dedupe_window);
    }
    std::size_t rec_index = 0;
    for (const auto& rec : b.records) {
      const std::size_t this_index = rec_index++;
      if (!rec.dedupe_key.empty() && opt_.dedupe_window > 0) {
        const Fingerprint key = w.batch_keys[this_index];
        if (!t.keys.remember(key, opt_.dedupe_window)) {  // seen before, or earlier in this group
          ++r.duplicates;
          continue;
        }
        w.new_keys.push_back(key);
      }
      const std::size_t size = record_size(b.producer, rec.dedupe_key, rec.payload);
      Chunk& c = chunk_for(w, size, w.next);
      const std::uint64_t pos = c.start + c.buf.size();
      if (!c.has_index || pos - c.last_index_pos >= opt_.index_interval_bytes) {
        c.index.push_back({w.next, pos});
        c.last_index_pos = pos;
        c.has_index = true;
      }
      encode_record(c.buf, w.next, time, b.seq, b.producer, rec.dedupe_key, rec.payload);
      c.max_time_us = std::max(c.max_time_us, time);
      ++w.next;
      ++r.written;
    }
  }
}

WriteBuffer LogStore::Impl::take_buffer() {
  if (spare_buffers_.empty()) return {};
  WriteBuffer b = std::move(spare_buffers_.back());
  spare_buffers_.pop_back();
  b.clear();
  return b;
}

// Keeps a few chunk buffers (not huge ones) for the next group commit; the chunks stay
// (their positions are revealed later).
void LogStore::Impl::recycle(TopicWork& w) {
  constexpr std::size_t kSpares = 4;
  constexpr std::size_t kMaxSpareBytes = 32u << 20;
  for (Chunk& c : w.chunks) {
    if (spare_buffers_.size() < kSpares && c.buf.capacity() > 0 && c.buf.capacity() <= kMaxSpareBytes)
      spare_buffers_.push_back(std::move(c.buf));
    c.buf = WriteBuffer{};
  }
}

Chunk& LogStore::Impl::chunk_for(TopicWork& w, std::size_t size, std::uint64_t offset) {
  auto new_chunk = [&]() -> Chunk& {
    Chunk c;
    c.buf = take_buffer();
    c.seg = std::make_shared<Segment>();
    c.seg->base = offset;
    c.seg->path = w.topic->dir / segment_name(offset);
    c.created = true;
    w.chunks.push_back(std::move(c));
    return w.chunks.back();
  };
  if (w.chunks.empty()) {
    const auto& active = w.topic->active;
    // Reuse the active segment unless it is empty with another base (a recovered gap),
    // which would break "a segment's first record has its base offset".
    if (!active || (active->written_size == 0 && active->base != offset)) return new_chunk();
    Chunk c;
    c.buf = take_buffer();
    c.seg = active;
    c.start = active->written_size;
    c.last_index_pos = active->last_index_pos;
    c.has_index = active->has_index;
    w.chunks.push_back(std::move(c));
  }
  Chunk& c = w.chunks.back();
  const std::uint64_t used = c.start + c.buf.size();
  if (used > 0 && used + size > opt_.segment_bytes) {
    w.rolled = true;
    return new_chunk();
  }
  return c;
}

void LogStore::Impl::write(TopicWork& w) {
  for (Chunk& c : w.chunks) {
    c.attempted = true;
    Segment& s = *c.seg;
    if (c.created) {
      s.fd = ::open(s.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (s.fd < 0 || (opt_.fsync.mode == FsyncPolicy::Mode::always && !s.open_sync_fds(kSyncers)))
        return rollback(w, "cannot create " + s.path.string() + ": " + errno_text(errno));
      // The new name must survive a crash as much as the data written into it.
      if (int err = fsync_dir(w.topic->dir)) return rollback(w, "cannot sync " + w.topic->dir.string() + ": " + errno_text(err));
    } else if (s.tail_dirty) {
      if (::ftruncate(s.fd, static_cast<off_t>(c.start)) != 0)
        return rollback(w, "cannot truncate " + s.path.string() + ": " + errno_text(errno));
      s.tail_dirty = false;
    }
    if (c.buf.empty()) continue;
    if (int err = pwrite_all(s.fd, c.buf.data(), c.buf.size(), c.start))
      return rollback(w, "cannot write " + s.path.string() + ": " + errno_text(err));
    c.len = c.buf.size();
  }
  recycle(w);
}

void LogStore::Impl::rollback(TopicWork& w, const std::string& why) {
  // Put every touched file back as it was so that the topic stays a clean, consecutive log
  // and a retry can succeed; the batches fail with `why`.
  for (Chunk& c : w.chunks) {
    if (!c.attempted) continue;
    Segment& s = *c.seg;
    if (c.created) {
      if (s.fd >= 0) {
        ::close(s.fd);
        s.fd = -1;
        s.close_sync_fds();
        std::error_code ec;
        fs::remove(s.path, ec);
      }
    } else if (::ftruncate(s.fd, static_cast<off_t>(c.start)) != 0) {
      s.tail_dirty = true;
      log_line("cannot truncate " + s.path.string() + " back to " + std::to_string(c.start) + ": " + errno_text(errno));
    }
  }
  for (const Fingerprint& key : w.new_keys) w.topic->keys.forget(key);  // a retry must be written
  for (const auto& [producer, seq] : w.producer_batches) {  // their later batches wait for these
    auto& seqs = w.topic->unwritten[std::string(producer)];
    if (seqs.size() < kMaxUnwritten) seqs.insert(seq);
  }
  recycle(w);
  w.chunks.clear();
  w.failed = true;
  w.error = why;
  log_line("append to topic '" + w.topic->name + "' failed: " + why);
}

// The writer's own state moves past a written group at once (the next group is encoded
// after it, possibly before this one is synced); readers see it only in reveal().
void LogStore::Impl::advance(TopicWork& w) {
  Topic& t = *w.topic;
  for (Chunk& c : w.chunks) {
    Segment& s = *c.seg;
    s.written_size = c.start + c.len;
    s.last_index_pos = c.last_index_pos;
    s.has_index = c.has_index;
    if (c.created) {
      if (t.active && opt_.fsync.mode == FsyncPolicy::Mode::always) {  // rolled: no more writes to it
        std::lock_guard lk(pipe_mu_);
        t.active->sealed = true;
        t.active->maybe_close_sync_fds();
      }
      t.active = c.seg;
    }
    if (opt_.fsync.mode == FsyncPolicy::Mode::interval && c.len > 0) {
      std::lock_guard lk(pipe_mu_);
      if (!s.sync_pending) {
        s.sync_pending = true;
        dirty_.push_back(c.seg);
      }
    }
  }
  t.next_offset = w.next;
  for (const auto& [producer, seq] : w.seq_overlay) {
    t.producer_seqs[std::string(producer)] = seq;
    if (!t.maybe_torn.empty()) t.maybe_torn.erase(std::string(producer));  // its last batch is whole now
  }
  if (!t.unwritten.empty())
    for (const auto& [producer, seq] : w.producer_batches)  // written now: no longer waited for
      if (auto f = t.unwritten.find(std::string(producer)); f != t.unwritten.end()) {
        f->second.erase(f->second.begin(), f->second.upper_bound(seq));
        if (f->second.empty()) t.unwritten.erase(f);
      }
  w.advanced = true;
}

// Readers see a group: new segments, committed sizes, index entries, the next offset.
// Groups of a topic are revealed in the order they were written.
void LogStore::Impl::reveal(TopicWork& w) {
  Topic& t = *w.topic;
  std::lock_guard lk(t.mu);
  for (Chunk& c : w.chunks) {
    Segment& s = *c.seg;
    if (c.created) t.segments.push_back(c.seg);
    s.committed_size = c.start + c.len;
    s.index.insert(s.index.end(), c.index.begin(), c.index.end());
    s.max_time_us = std::max(s.max_time_us, c.max_time_us);
    t.bytes += c.len;
  }
  t.committed_next = w.next;
}

int LogStore::Impl::timed_fdatasync(int fd) {
  const auto start = std::chrono::steady_clock::now();
  const int rc = (opt_.segment_sync ? opt_.segment_sync(fd) : ::fdatasync(fd)) == 0 ? 0 : errno;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard lk(stats_mu_);
  ++stats_.count;
  stats_.sum += secs;
  for (std::size_t i = 0; i < stats_.bucket_bounds.size(); ++i)
    if (secs <= stats_.bucket_bounds[i]) ++stats_.bucket_counts[i];
  return rc;
}

void LogStore::Impl::enforce_retention_locked() {
  const std::int64_t now = now_us();
  for (Topic* t : all_topics()) {
    const Retention keep = retention_of(t->name, opt_.retention_by_topic, default_retention());
    const std::int64_t age_us = std::chrono::duration_cast<std::chrono::microseconds>(keep.age).count();
    std::vector<std::shared_ptr<Segment>> removed;
    {
      std::lock_guard lk(t->mu);
      // The active (last) segment always stays: it is where the next record goes.
      while (t->segments.size() > 1) {
        const auto& s = t->segments.front();
        const bool too_big = keep.bytes > 0 && t->bytes > keep.bytes;
        const bool too_old = age_us > 0 && s->max_time_us < now - age_us;
        if (!too_big && !too_old) break;
        t->bytes -= s->committed_size;
        removed.push_back(s);
        t->segments.erase(t->segments.begin());
      }
    }
    for (const auto& s : removed) {
      // Readers holding the segment keep reading through its open fd.
      if (::unlink(s->path.c_str()) != 0)
        log_line("retention: cannot delete " + s->path.string() + ": " + errno_text(errno));
    }
    if (!removed.empty()) (void)fsync_dir(t->dir);
  }
}

// ---------------------------------------------------------------------------------------
// LogStore

LogStore::LogStore(LogOptions options) : self_(std::make_unique<Impl>(std::move(options))) {}

LogStore::~LogStore() = default;

void LogStore::append(std::string topic, std::string producer_id, std::uint64_t seq, std::vector<AppendRecord> records,
                      Completion done) {
  {
    std::lock_guard lk(self_->queue_mu_);
    self_->queue_.push_back(Pending{std::move(topic), std::move(producer_id), seq, std::move(records), std::move(done)});
  }
  self_->queue_cv_.notify_one();
}

std::size_t LogStore::visit(const std::string& topic, std::uint64_t from, std::size_t max_records,
                            std::size_t max_bytes, const std::function<void(const RecordRef&)>& fn) const {
  std::size_t out = 0;
  Topic* t = self_->find_topic(topic);
  if (!t || max_records == 0) return out;

  struct Part {
    std::shared_ptr<Segment> seg;
    std::uint64_t start;
    std::uint64_t end;
  };
  std::vector<Part> parts;
  {
    std::lock_guard lk(t->mu);
    if (from >= t->committed_next || t->segments.empty()) return out;
    const auto& segs = t->segments;
    auto it = std::upper_bound(segs.begin(), segs.end(), from,
                               [](std::uint64_t f, const std::shared_ptr<Segment>& s) { return f < s->base; });
    std::size_t first = it == segs.begin() ? 0 : static_cast<std::size_t>(it - segs.begin()) - 1;
    for (std::size_t i = first; i < segs.size(); ++i) {
      std::uint64_t start = 0;
      if (i == first) {
        const auto& idx = segs[i]->index;
        auto e = std::upper_bound(idx.begin(), idx.end(), from,
                                  [](std::uint64_t f, const IndexEntry& x) { return f < x.offset; });
        if (e != idx.begin()) start = std::prev(e)->pos;
      }
      parts.push_back({segs[i], start, segs[i]->committed_size});
    }
  }

  std::size_t bytes = 0;
  const std::size_t window = std::clamp<std::size_t>(max_bytes + 4096, 64u << 10, 4u << 20);
  for (const Part& part : parts) {
    RecordScanner sc(part.seg->fd, part.start, part.end, window);
    for (;;) {
      const auto status = sc.next();
      if (status == RecordScanner::Status::end) break;
      if (status != RecordScanner::Status::record) {
        // Committed data went bad after recovery (disk corruption): never serve it.
        log_line("read: " + part.seg->path.string() + " byte " + std::to_string(sc.pos()) + ": " + sc.reason() +
                 "; skipping the rest of the segment");
        break;
      }
      const RecordView& r = sc.record();
      if (r.offset < from) continue;
      if (out > 0 && bytes + r.payload.size() > max_bytes) return out;
      fn(RecordRef{r.offset, r.time_us, r.payload});
      ++out;
      bytes += r.payload.size();
      if (out >= max_records) return out;
    }
  }
  return out;
}

std::uint64_t LogStore::offset_at_time(const std::string& topic, std::int64_t time_us) const {
  std::uint64_t lo = first_offset(topic), hi = committed_offset(topic);  // the answer is in [lo, hi]
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    bool seen = false;
    std::uint64_t at = 0;
    std::int64_t t = 0;
    visit(topic, mid, 1, 1, [&](const RecordRef& r) { seen = true, at = r.offset, t = r.time_us; });
    if (!seen || t >= time_us) hi = mid;  // nothing readable from mid on, or mid's record is late enough
    else lo = at + 1;
  }
  return lo;
}

std::uint64_t LogStore::committed_offset(const std::string& topic) const {
  Topic* t = self_->find_topic(topic);
  if (!t) return 0;
  std::lock_guard lk(t->mu);
  return t->committed_next;
}

std::uint64_t LogStore::first_offset(const std::string& topic) const {
  Topic* t = self_->find_topic(topic);
  if (!t) return 0;
  std::lock_guard lk(t->mu);
  return t->segments.empty() ? t->committed_next : t->segments.front()->base;
}

std::vector<std::string> LogStore::topics() const {
  std::shared_lock lk(self_->topics_mu_);
  std::vector<std::string> out;
  out.reserve(self_->topics_.size());
  for (const auto& [name, t] : self_->topics_) out.push_back(name);
  return out;  // std::map: already sorted
}

std::optional<TopicInfo> LogStore::info(const std::string& topic) const {
  Topic* t = self_->find_topic(topic);
  if (!t) return std::nullopt;
  std::lock_guard lk(t->mu);
  TopicInfo i;
  i.name = t->name;
  i.first_offset = t->segments.empty() ? t->committed_next : t->segments.front()->base;
  i.next_offset = t->committed_next;
  i.bytes = t->bytes;
  i.segments = t->segments.size();
  const Retention keep = retention_of(t->name, self_->opt_.retention_by_topic, self_->default_retention());
  i.retention_bytes = keep.bytes;
  i.retention_age_s = keep.age.count();
  return i;
}

void LogStore::set_commit_listener(CommitListener listener) {
  auto p = std::make_shared<const CommitListener>(std::move(listener));
  std::lock_guard lk(self_->queue_mu_);
  self_->listener_ = std::move(p);
}

LogStore::FsyncStats LogStore::fsync_stats() const {
  std::lock_guard lk(self_->stats_mu_);
  return self_->stats_;
}

void LogStore::enforce_retention() {
  std::lock_guard wl(self_->write_mu_);
  self_->enforce_retention_locked();
}

void LogStore::commit_group_offset(const std::string& group, const std::string& topic, std::uint64_t offset) {
  self_->groups_->commit(group, topic, offset);
}

std::optional<std::uint64_t> LogStore::group_offset(const std::string& group, const std::string& topic) const {
  return self_->groups_->offset(group, topic);
}

std::vector<std::tuple<std::string, std::string, std::uint64_t>> LogStore::group_offsets() const {
  return self_->groups_->all();
}

std::vector<std::string> LogStore::verify() const {
  std::vector<std::string> problems;
  for (Topic* t : self_->all_topics()) {
    std::vector<std::pair<std::shared_ptr<Segment>, std::uint64_t>> segs;
    {
      std::lock_guard lk(t->mu);
      for (const auto& s : t->segments) segs.emplace_back(s, s->committed_size);
    }
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const Segment& s = *segs[i].first;
      const std::uint64_t next_base = i + 1 < segs.size() ? segs[i + 1].first->base : UINT64_MAX;
      const std::string where = t->name + "/" + s.path.filename().string();
      RecordScanner sc(s.fd, 0, segs[i].second, kRecoveryWindow);
      std::uint64_t expected = s.base;
      for (;;) {
        const auto status = sc.next();
        if (status == RecordScanner::Status::end) break;
        if (status != RecordScanner::Status::record) {
          problems.push_back(where + ": byte " + std::to_string(sc.pos()) + ": " + sc.reason());
          break;
        }
        const RecordView& r = sc.record();
        if (r.offset != expected)
          problems.push_back(where + ": byte " + std::to_string(sc.record_pos()) + ": offset " +
                             std::to_string(r.offset) + " where " + std::to_string(expected) + " was expected");
        if (r.offset >= next_base)
          problems.push_back(where + ": byte " + std::to_string(sc.record_pos()) + ": offset " +
                             std::to_string(r.offset) + " reaches the next segment's base");
        expected = r.offset + 1;
      }
    }
  }
  return problems;
}

}  // namespace diaspora::relay
