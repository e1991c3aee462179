// The engine plugin's on-disk spool (see spool.hpp for the layout, the record format and
// the durability promises).
//
// Cursor file (one line of text):
//   diaspora-spool-cursor 1 <segment> <offset> <superseded> <crc32c of the text before it, 8 hex>\n
// <segment>/<offset> is the first unacknowledged record. Segments numbered below <segment>
// hold only acknowledged records; segments numbered in (<segment>, <superseded>] were
// replaced by prepend() and hold nothing live. Recovery deletes both kinds. A cursor file
// that does not parse or whose checksum fails restarts delivery at the oldest segment.
//
// Why prepend() neither loses nor duplicates a record when the process dies at any point:
//   1. it writes the new head segment P (numbered below every segment file ever seen) with
//      the new records and a copy of the unacknowledged rest of the head segment H, then
//      fdatasyncs P and the directory;
//   2. it writes cursor.tmp = (P, 0, superseded >= H), fsyncs it and renames it over cursor
//      (the switch), then fsyncs the directory;
//   3. it deletes H.
// Dying before the rename leaves the old cursor (H, o): P lies below it and is deleted by
// recovery, so the state is the old one (the prepend() call had no effect; it had not
// returned). Dying after the rename leaves the new cursor: recovery deletes H (and any
// other segment in (P, superseded]) whether or not step 3 ran, so H's records live only in
// P. Segments after H have numbers above superseded and stay. New tail segments are numbered
// above every number seen, so they never fall into a superseded range. A power loss is
// covered the same way by the fsyncs in steps 1 and 2, which order P's data and name before
// the switch.
//
// In memory:
//   segments_     live segments by number = replay order; front() holds the cursor (when the
//                 spool has no segment, the cursor names the segment the next append creates);
//                 back() is the tail
//   cursor_       durable cursor; cursor_before_ = records of its segment before it
//   read_         read position (>= cursor_); read_before_ likewise
//   marks_        positions read() returned with the records before them in their segment,
//                 so that commit() keeps records() exact without re-scanning the segment
// At most three segment files are open: the tail, the one being read, and briefly one more.
#include "spool.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <system_error>
#include <utility>

#include "diaspora/crc32c.hpp"
#include "diaspora/files.hpp"
#include "diaspora/records.hpp"

namespace diaspora::plugin {

namespace fs = std::filesystem;
using storage::errno_text;
using storage::Fd;
using storage::FileWindow;
using storage::Frame;
using storage::fsync_dir;
using storage::kFrameHeaderBytes;
using storage::pread_all;
using storage::pwrite_all;

namespace {

constexpr std::uint64_t kFirstSegment = 1ull << 40;  // room below for prepend()
constexpr std::size_t kFrameBytes = kFrameHeaderBytes;
constexpr std::uint32_t kMaxPayload = 64u << 20;
// An empty record is refused because a zero-filled stretch of disk would read as a run of
// valid empty records (length 0, CRC32C of nothing = 0).
constexpr storage::FrameLimits kLimits{1, kMaxPayload};
constexpr std::string_view kExt = ".spool";
constexpr std::size_t kReadWindow = 256u << 10;       // read-ahead of read()
constexpr std::size_t kRecoveryWindow = 1u << 20;     // read-ahead when scanning a whole segment
constexpr std::size_t kCopyChunk = 1u << 20;          // prepend() copies the head in these
constexpr std::size_t kMaxMarks = 4096;
constexpr std::size_t kShrinkAbove = 8u << 20;        // release buffers grown by a huge record
constexpr std::string_view kCursorTag = "diaspora-spool-cursor 1";
constexpr std::uint64_t kNoSegment = 0;               // segment numbers start at 2^40 - prepends

std::string segment_name(std::uint64_t number) { return storage::segment_name(number, kExt); }

struct Cursor {
  std::uint64_t segment = 0;
  std::uint64_t offset = 0;
  std::uint64_t superseded = 0;  // 0 = none
};

std::string format_cursor(const Cursor& c) {
  std::string body(kCursorTag);
  for (std::uint64_t v : {c.segment, c.offset, c.superseded}) body += " " + std::to_string(v);
  char crc[16];
  std::snprintf(crc, sizeof crc, " %08x\n", static_cast<unsigned>(crc32c(body.data(), body.size())));
  return body + crc;
}

std::optional<Cursor> parse_cursor(std::string_view text) {
  if (text.empty() || text.back() != '\n') return std::nullopt;
  text.remove_suffix(1);
  const auto space = text.rfind(' ');
  if (space == std::string_view::npos || text.size() - space != 9) return std::nullopt;
  const std::string_view body = text.substr(0, space);
  std::uint32_t crc = 0;
  auto [crc_end, crc_ec] = std::from_chars(text.data() + space + 1, text.data() + text.size(), crc, 16);
  if (crc_ec != std::errc() || crc_end != text.data() + text.size() || crc != crc32c(body.data(), body.size()))
    return std::nullopt;
  if (body.substr(0, kCursorTag.size()) != kCursorTag) return std::nullopt;
  const char* p = body.data() + kCursorTag.size();
  const char* last = body.data() + body.size();
  Cursor c;
  for (std::uint64_t* v : {&c.segment, &c.offset, &c.superseded}) {
    if (p == last || *p != ' ') return std::nullopt;
    auto [end, ec] = std::from_chars(p + 1, last, *v);
    if (ec != std::errc()) return std::nullopt;
    p = end;
  }
  if (p != last) return std::nullopt;
  return c;
}

Frame next_frame(FileWindow& r, std::uint64_t pos, bool check_crc) {
  return storage::read_frame(r, pos, kLimits, check_crc);
}

std::uint64_t count_lost(FileWindow& r, std::uint64_t from, std::uint64_t after) {
  return storage::count_lost_frames(r, from, after, kLimits);
}

struct Segment {
  std::uint64_t number = 0;
  fs::path path;
  Fd fd;                      // opened lazily (O_RDWR)
  std::uint64_t size = 0;     // bytes of good records; the file may hold more (a skipped corrupt rest)
  std::uint64_t records = 0;  // records in [0, size)
};

struct Mark {
  SpoolPosition pos;
  std::uint64_t before = 0;  // records of pos.segment before pos.offset
};

}  // namespace

struct Spool::Impl {
  explicit Impl(SpoolOptions options);

  void recover();
  void log(const std::string& line) const noexcept;
  [[noreturn]] void fail(const std::string& what, int err) const;
  void check_records(std::span<const std::string_view> records, std::uint64_t& bytes) const;
  void encode(std::span<const std::string_view> records);
  std::size_t find(std::uint64_t number) const noexcept;
  int fd_of(Segment& s);
  void close_fd(Segment& s) noexcept;
  FileWindow& reader_for(Segment& s);
  Segment& writable_tail();
  void write_cursor(const Cursor& c, bool durable);
  std::uint64_t records_before(Segment& s, std::uint64_t offset);
  void skip_corrupt(Segment& s, const std::string& why);
  void remove_file(const fs::path& path) const noexcept;

  SpoolOptions opt_;
  Fd lock_;  // declared first: released last
  std::vector<Segment> segments_;
  SpoolPosition cursor_;
  std::uint64_t cursor_before_ = 0;
  SpoolPosition read_;
  std::uint64_t read_before_ = 0;
  std::uint64_t superseded_ = 0;
  std::uint64_t lowest_seen_ = kFirstSegment;       // lowest segment number that may exist on disk
  std::uint64_t highest_seen_ = kFirstSegment - 1;  // highest number ever used or named in the cursor
  std::uint64_t total_size_ = 0;                    // over segments_
  std::uint64_t total_records_ = 0;
  std::uint64_t corrupt_ = 0;
  bool tail_broken_ = false;  // the tail file holds bytes past its size: append to a new one
  bool dir_dirty_ = false;    // a segment was created since the last sync()
  std::vector<std::uint64_t> unsynced_;  // closed tails written since the last sync()
  std::deque<Mark> marks_;
  FileWindow reader_;
  std::uint64_t reader_segment_ = kNoSegment;
  SpoolRecords wbuf_;  // append(span) and prepend() frame their records here
  /// Writes framed records at the tail (the write path of both append()s).
  std::size_t write_tail(const SpoolRecords& r, bool droppable);
};

Spool::Impl::Impl(SpoolOptions options) : opt_(std::move(options)) {
  if (opt_.dir.empty()) throw SpoolError("spool directory not set");
  if (opt_.segment_bytes == 0)
    throw SpoolError("spool segment_bytes must be positive (spool " + opt_.dir.string() + ")");
  std::error_code ec;
  fs::create_directories(opt_.dir, ec);
  if (ec)
    throw SpoolError("cannot create spool directory " + opt_.dir.string() + ": " + ec.message() +
                     "; check the path and its permissions");

  // Two writers would interleave records and fight over the cursor.
  int err = 0;
  lock_ = storage::lock_directory(opt_.dir, err);
  if (err == EWOULDBLOCK)
    throw SpoolError("spool " + opt_.dir.string() +
                     " is in use by another process; stop it or give this one another spool directory");
  if (err) fail("cannot lock " + (opt_.dir / ".lock").string(), err);
  try {
    recover();
  } catch (const fs::filesystem_error& e) {
    throw SpoolError(std::string("cannot read spool directory: ") + e.what());
  }
}

void Spool::Impl::log(const std::string& line) const noexcept {
  try {
    if (opt_.log) {
      opt_.log(line);
      return;
    }
  } catch (...) {
    // A failing log sink must not fail the spool; fall back to stderr.
  }
  std::fprintf(stderr, "diaspora-plugin: spool: %s\n", line.c_str());
}

void Spool::Impl::fail(const std::string& what, int err) const {
  throw SpoolError(what + ": " + errno_text(err) + " (spool " + opt_.dir.string() +
                   "; check free space and permissions there)");
}

void Spool::Impl::remove_file(const fs::path& path) const noexcept {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    log("cannot delete " + path.string() + ": " + errno_text(errno) + " (recovery deletes it later)");
}

// ---------------------------------------------------------------------------------------
// Recovery

void Spool::Impl::recover() {
  const fs::path cursor_path = opt_.dir / "cursor";
  std::optional<Cursor> saved;
  bool rewrite = false;
  {
    Fd fd(::open(cursor_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd && errno != ENOENT) fail("cannot open " + cursor_path.string(), errno);
    if (!fd) {
      rewrite = true;
    } else {
      char buf[256];
      ssize_t n = 0;
      do n = ::pread(fd.get(), buf, sizeof buf, 0);
      while (n < 0 && errno == EINTR);
      if (n < 0) fail("cannot read " + cursor_path.string(), errno);
      saved = parse_cursor(std::string_view(buf, static_cast<std::size_t>(n)));
      if (!saved) {
        log("cursor file " + cursor_path.string() +
            " is damaged; replaying from the oldest segment (records may be delivered twice)");
        rewrite = true;
      }
    }
  }

  std::vector<std::pair<std::uint64_t, fs::path>> files = storage::list_segments(opt_.dir, kExt);
  std::erase_if(files, [](const auto& f) { return f.first == 0; });  // never written (0 means "none" in memory)
  for (const auto& f : files) {
    lowest_seen_ = std::min(lowest_seen_, f.first);
    highest_seen_ = std::max(highest_seen_, f.first);
  }

  Cursor c;
  if (saved) {
    c = *saved;
    superseded_ = saved->superseded;
    // New tails must number above anything the cursor refers to (see the top of the file).
    highest_seen_ = std::max({highest_seen_, c.superseded, c.segment == 0 ? 0 : c.segment - 1});
  } else if (!files.empty()) {
    c.segment = files.front().first;
  }

  // Segments before the cursor were acknowledged; superseded ones were copied by prepend().
  std::vector<std::pair<std::uint64_t, fs::path>> live;
  for (auto& f : files) {
    if (f.first < c.segment || (f.first > c.segment && f.first <= superseded_)) {
      remove_file(f.second);
      continue;
    }
    live.push_back(std::move(f));
  }
  if (live.empty()) {
    const Cursor fresh{highest_seen_ + 1, 0, superseded_};
    if (saved && (fresh.segment != c.segment || c.offset != 0)) rewrite = true;
    c = fresh;
  } else if (live.front().first != c.segment) {
    // The cursor's segment is gone: it was wholly acknowledged.
    c.segment = live.front().first;
    c.offset = 0;
    rewrite = true;
  }

  for (std::size_t i = 0; i < live.size(); ++i) {
    Segment s;
    s.number = live[i].first;
    s.path = live[i].second;
    s.fd = Fd(::open(s.path.c_str(), O_RDWR | O_CLOEXEC));
    if (!s.fd) fail("cannot open spool segment " + s.path.string(), errno);
    struct stat st {};
    if (::fstat(s.fd.get(), &st) != 0) fail("cannot stat spool segment " + s.path.string(), errno);
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    const bool head = i == 0;
    const bool last = i + 1 == live.size();
    const std::uint64_t want = head ? c.offset : 0;

    FileWindow r;
    r.reset(s.fd.get(), file_size, kRecoveryWindow);
    std::uint64_t pos = 0;
    std::uint64_t n = 0;
    std::uint64_t boundary = 0;  // last record boundary at or before `want`
    std::uint64_t before = 0;
    Frame f;
    for (;;) {
      if (pos <= want) {
        boundary = pos;
        before = n;
      }
      f = next_frame(r, pos, true);
      if (f.status != Frame::Status::ok) break;
      pos += kFrameBytes + f.length;
      ++n;
    }
    if (f.status == Frame::Status::io_error) fail("cannot read spool segment " + s.path.string(), f.err);
    s.size = pos;
    s.records = n;
    if (f.status != Frame::Status::end) {
      std::uint64_t lost = 0;
      // A torn record is an append that never returned (the process died in write()); a
      // corrupt one was damaged after it was written.
      if (f.status == Frame::Status::corrupt) lost = count_lost(r, pos, want);
      corrupt_ += lost;
      const std::string found = s.path.string() + " byte " + std::to_string(pos) + " of " +
                                std::to_string(file_size) + ": " + f.why + " (" + std::to_string(lost) +
                                " unacknowledged records lost)";
      if (last) {
        if (::ftruncate(s.fd.get(), static_cast<off_t>(pos)) != 0 || ::fdatasync(s.fd.get()) != 0)
          fail("cannot truncate damaged spool segment " + s.path.string(), errno);
        log("recovery: " + found + "; truncated there");
      } else {
        log("recovery: " + found + "; skipping the rest of the segment");
      }
    }
    if (head && boundary != want) {
      log("recovery: the cursor pointed to byte " + std::to_string(want) + " of " + s.path.string() +
          ", past its last good record or inside a record; resuming at byte " + std::to_string(boundary));
      c.offset = boundary;
      rewrite = true;
    }
    if (head) cursor_before_ = before;
    if (!last) s.fd.reset();  // reopened when read
    total_size_ += s.size;
    total_records_ += s.records;
    segments_.push_back(std::move(s));
  }

  cursor_ = {c.segment, c.offset};
  read_ = cursor_;
  read_before_ = cursor_before_;
  // Writing the cursor now also makes a later prepend() safe when there was none.
  if (rewrite) write_cursor({cursor_.segment, cursor_.offset, superseded_}, false);
}

// ---------------------------------------------------------------------------------------
// Helpers

void Spool::Impl::check_records(std::span<const std::string_view> records, std::uint64_t& bytes) const {
  bytes = 0;
  for (std::string_view r : records) {
    if (r.empty())  // see kLimits
      throw SpoolError("cannot spool an empty record (spool " + opt_.dir.string() + "): pass the event's bytes");
    if (r.size() > kMaxPayload)
      throw SpoolError("cannot spool a record of " + std::to_string(r.size()) + " bytes (spool " + opt_.dir.string() +
                       "): the limit is 64 MiB");
    bytes += kFrameBytes + r.size();
  }
}

std::string& SpoolRecords::begin() {
  if (open_ != std::string::npos) end();
  buf_.append(kFrameBytes, '\0');  // may throw: then no record is open
  open_ = buf_.size() - kFrameBytes;
  return buf_;
}

void SpoolRecords::end() {
  if (open_ == std::string::npos) return;
  const std::size_t at = open_, n = buf_.size() - at - kFrameBytes;
  if (n == 0 || n > kMaxPayload) {
    cancel();
    // Not the spool's directory: these records belong to no spool yet.
    if (n) throw SpoolError("cannot spool a record of " + std::to_string(n) + " bytes: the limit is 64 MiB");
    return;
  }
  storage::seal_frame(buf_.data() + at, static_cast<std::uint32_t>(n));
  open_ = std::string::npos;
  ++count_;
}

void SpoolRecords::cancel() noexcept {
  if (open_ == std::string::npos) return;
  buf_.resize(open_);
  open_ = std::string::npos;
}

void SpoolRecords::clear() noexcept {
  if (buf_.capacity() > kShrinkAbove) std::string().swap(buf_);
  buf_.clear();
  open_ = std::string::npos;
  count_ = 0;
}

void Spool::Impl::encode(std::span<const std::string_view> records) {
  wbuf_.clear();
  for (std::string_view r : records) {
    wbuf_.begin().append(r);
    wbuf_.end();
  }
}

std::size_t Spool::Impl::find(std::uint64_t number) const noexcept {
  auto it = std::lower_bound(segments_.begin(), segments_.end(), number,
                             [](const Segment& s, std::uint64_t n) { return s.number < n; });
  if (it == segments_.end() || it->number != number) return segments_.size();
  return static_cast<std::size_t>(it - segments_.begin());
}

int Spool::Impl::fd_of(Segment& s) {
  if (!s.fd) {
    s.fd = Fd(::open(s.path.c_str(), O_RDWR | O_CLOEXEC));
    if (!s.fd) fail("cannot open spool segment " + s.path.string(), errno);
  }
  return s.fd.get();
}

void Spool::Impl::close_fd(Segment& s) noexcept {
  if (reader_segment_ == s.number) reader_segment_ = kNoSegment;
  s.fd.reset();
}

FileWindow& Spool::Impl::reader_for(Segment& s) {
  if (reader_segment_ != s.number || reader_.limit() > s.size) {
    const int fd = fd_of(s);
    reader_.reset(fd, s.size, kReadWindow);
    reader_segment_ = s.number;
  } else if (reader_.limit() < s.size) {
    reader_.extend(s.size);
  }
  return reader_;
}

Segment& Spool::Impl::writable_tail() {
  if (!segments_.empty() && !tail_broken_ && segments_.back().size < opt_.segment_bytes) {
    fd_of(segments_.back());
    return segments_.back();
  }
  Segment s;
  s.number = highest_seen_ + 1;
  s.path = opt_.dir / segment_name(s.number);
  s.fd = Fd(::open(s.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!s.fd) fail("cannot create spool segment " + s.path.string(), errno);
  highest_seen_ = s.number;
  dir_dirty_ = true;
  tail_broken_ = false;
  if (!segments_.empty()) {
    Segment& old = segments_.back();
    unsynced_.push_back(old.number);
    if (read_.segment != old.number) close_fd(old);
  }
  segments_.push_back(std::move(s));
  return segments_.back();
}

void Spool::Impl::write_cursor(const Cursor& c, bool durable) {
  const fs::path path = opt_.dir / "cursor";
  try {
    write_file_atomic(path, format_cursor(c), 0644, durable ? Durability::file : Durability::process);
  } catch (const Error& e) {
    throw SpoolError("cannot write spool cursor " + path.string() + " (" + e.what() + "; spool " + opt_.dir.string() +
                     "; check free space and permissions there)");
  }
  // The switch has happened; from here on nothing may undo it.
  if (durable) {
    if (int err = fsync_dir(opt_.dir))
      log("cannot sync " + opt_.dir.string() + " after writing the cursor: " + errno_text(err));
  }
}

std::uint64_t Spool::Impl::records_before(Segment& s, std::uint64_t offset) {
  if (offset == 0) return 0;
  if (offset == s.size) return s.records;
  for (const Mark& m : marks_)
    if (m.pos.segment == s.number && m.pos.offset == offset) return m.before;
  // Not a position read() returned lately: count from the nearest known boundary.
  std::uint64_t pos = 0;
  std::uint64_t n = 0;
  if (s.number == cursor_.segment && cursor_.offset <= offset) {
    pos = cursor_.offset;
    n = cursor_before_;
  }
  if (s.number == read_.segment && read_.offset <= offset && read_.offset >= pos) {
    pos = read_.offset;
    n = read_before_;
  }
  FileWindow& r = reader_for(s);
  while (pos < offset) {
    Frame f = next_frame(r, pos, false);
    if (f.status == Frame::Status::io_error) fail("cannot read spool segment " + s.path.string(), f.err);
    if (f.status != Frame::Status::ok) break;
    pos += kFrameBytes + f.length;
    ++n;
  }
  if (pos != offset)
    throw SpoolError("spool position " + std::to_string(s.number) + ":" + std::to_string(offset) + " in " +
                     opt_.dir.string() + " is not a record boundary: pass a position that read() returned");
  return n;
}

void Spool::Impl::skip_corrupt(Segment& s, const std::string& why) {
  // The record at read_ went bad after recovery checked it (a damaged disk): never return it.
  // The rest of the segment goes, as recovery would do.
  FileWindow& r = reader_for(s);
  const std::uint64_t lost = std::max<std::uint64_t>(1, count_lost(r, read_.offset, read_.offset));
  corrupt_ += lost;
  log(s.path.string() + " byte " + std::to_string(read_.offset) + ": " + why + "; skipping the rest of the segment (" +
      std::to_string(lost) + " records)");
  total_size_ -= s.size - read_.offset;
  total_records_ -= s.records - read_before_;
  s.size = read_.offset;
  s.records = read_before_;
  if (&s == &segments_.back()) tail_broken_ = true;
  reader_segment_ = kNoSegment;
}

// ---------------------------------------------------------------------------------------
// Spool

Spool::Spool(SpoolOptions options) : self_(std::make_unique<Impl>(std::move(options))) {}

Spool::~Spool() = default;

std::size_t Spool::append(std::span<const std::string_view> records, bool droppable) {
  Impl& m = *self_;
  std::uint64_t total = 0;
  m.check_records(records, total);
  m.encode(records);
  return m.write_tail(m.wbuf_, droppable);
}

std::size_t Spool::append(const SpoolRecords& records, bool droppable) { return self_->write_tail(records, droppable); }

std::size_t Spool::Impl::write_tail(const SpoolRecords& r, bool droppable) {
  Impl& m = *this;
  if (r.count_ == 0) return 0;
  const std::size_t total = r.open_ == std::string::npos ? r.buf_.size() : r.open_;
  // Spool::bytes() after the write: what a restart would replay.
  if (droppable && m.total_size_ - m.cursor_.offset + total > m.opt_.max_bytes) return 0;
  Segment& t = m.writable_tail();
  if (int err = pwrite_all(t.fd.get(), r.buf_.data(), total, t.size)) {
    if (::ftruncate(t.fd.get(), static_cast<off_t>(t.size)) != 0) {
      // Recovery would keep a whole-record prefix of this write; later appends must not
      // follow the torn rest, so they go to a new segment.
      m.tail_broken_ = true;
      m.log("cannot undo a failed append to " + t.path.string() + ": " + errno_text(errno));
    }
    m.fail("cannot append to spool segment " + t.path.string(), err);
  }
  t.size += total;
  t.records += r.count_;
  m.total_size_ += total;
  m.total_records_ += r.count_;
  return r.count_;
}

void Spool::prepend(std::span<const std::string_view> records) {
  Impl& m = *self_;
  rewind();
  std::uint64_t total = 0;
  m.check_records(records, total);
  if (records.empty()) return;
  if (m.lowest_seen_ <= 1)
    throw SpoolError("spool " + m.opt_.dir.string() + " has no segment number left below the head");

  m.segments_.reserve(m.segments_.size() + 1);  // so that step 3 cannot fail

  // 1. The new head segment: these records, then the unacknowledged rest of the old head.
  Segment p;
  p.number = m.lowest_seen_ - 1;
  p.path = m.opt_.dir / segment_name(p.number);
  p.fd = Fd(::open(p.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!p.fd) m.fail("cannot create spool segment " + p.path.string(), errno);
  auto give_up = [&](const std::string& what, int err) {
    p.fd.reset();
    m.remove_file(p.path);
    m.fail(what, err);
  };
  m.encode(records);
  if (int err = pwrite_all(p.fd.get(), m.wbuf_.buf_.data(), m.wbuf_.buf_.size(), 0))
    give_up("cannot write " + p.path.string(), err);
  p.size = total;
  p.records = records.size();
  Segment* head = m.segments_.empty() ? nullptr : &m.segments_.front();
  if (head) {
    const int from = m.fd_of(*head);
    std::string chunk;
    for (std::uint64_t pos = m.cursor_.offset; pos < head->size;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kCopyChunk, head->size - pos));
      chunk.resize(n);
      if (int err = pread_all(from, chunk.data(), n, pos)) give_up("cannot read " + head->path.string(), err);
      if (int err = pwrite_all(p.fd.get(), chunk.data(), n, p.size)) give_up("cannot write " + p.path.string(), err);
      pos += n;
      p.size += n;
    }
    p.records += head->records - m.cursor_before_;
  }
  if (::fdatasync(p.fd.get()) != 0) give_up("cannot sync " + p.path.string(), errno);
  if (int err = fsync_dir(m.opt_.dir)) give_up("cannot sync " + m.opt_.dir.string(), err);

  // 2. The switch.
  const Cursor c{p.number, 0, std::max(m.superseded_, head ? head->number : 0)};
  try {
    m.write_cursor(c, true);
  } catch (...) {
    p.fd.reset();
    m.remove_file(p.path);
    throw;
  }

  // 3. Drop the old head; nothing below may throw.
  const bool head_was_tail = head && m.segments_.size() == 1;
  if (head) {
    Segment old = std::move(m.segments_.front());
    m.segments_.erase(m.segments_.begin());
    m.total_size_ -= old.size;
    m.total_records_ -= old.records;
    m.close_fd(old);
    std::erase(m.unsynced_, old.number);
    m.remove_file(old.path);
  }
  if (head_was_tail || !head) m.tail_broken_ = false;  // p is the tail now, and clean
  m.total_size_ += p.size;
  m.total_records_ += p.records;
  m.lowest_seen_ = p.number;
  m.highest_seen_ = std::max(m.highest_seen_, p.number);
  m.superseded_ = c.superseded;
  m.cursor_ = m.read_ = {p.number, 0};
  m.cursor_before_ = m.read_before_ = 0;
  m.marks_.clear();
  m.segments_.insert(m.segments_.begin(), std::move(p));
}

std::size_t Spool::read(std::vector<std::string>& out, std::size_t max_records, std::size_t max_bytes,
                        SpoolPosition& end) {
  return read([&](std::string_view r) { out.emplace_back(r); }, max_records, max_bytes, end);
}

std::size_t Spool::read(const std::function<void(std::string_view)>& sink, std::size_t max_records,
                        std::size_t max_bytes, SpoolPosition& end) {
  Impl& m = *self_;
  // A sink (or a read) that throws leaves the read position as it was: this call's
  // records come again.
  struct Restore {
    Impl& m;
    SpoolPosition read;
    std::uint64_t before;
    bool armed = true;
    ~Restore() {
      if (armed) m.read_ = read, m.read_before_ = before;
    }
  } restore{m, m.read_, m.read_before_};
  std::size_t n = 0;
  std::size_t bytes = 0;
  std::size_t idx = m.find(m.read_.segment);
  while (n < max_records && idx < m.segments_.size()) {
    Segment& s = m.segments_[idx];
    if (m.read_.offset >= s.size) {
      if (idx + 1 == m.segments_.size()) break;
      m.close_fd(s);  // keep at most the tail and the segment being read open
      ++idx;
      m.read_ = {m.segments_[idx].number, 0};
      m.read_before_ = 0;
      continue;
    }
    FileWindow& r = m.reader_for(s);
    Frame f = next_frame(r, m.read_.offset, false);
    if (f.status == Frame::Status::io_error) m.fail("cannot read spool segment " + s.path.string(), f.err);
    if (f.status != Frame::Status::ok) {
      m.skip_corrupt(s, f.why);
      continue;
    }
    if (n > 0 && bytes + f.length > max_bytes) break;
    const char* payload = nullptr;
    if (int err = r.view(m.read_.offset + kFrameBytes, f.length, payload))
      m.fail("cannot read spool segment " + s.path.string(), err < 0 ? EIO : err);
    if (crc32c(payload, f.length) != f.crc) {
      m.skip_corrupt(s, "checksum mismatch");
      continue;
    }
    sink(std::string_view(payload, f.length));
    ++n;
    bytes += f.length;
    m.read_.offset += kFrameBytes + f.length;
    ++m.read_before_;
  }
  if (n > 0) {
    m.marks_.push_back({m.read_, m.read_before_});
    if (m.marks_.size() > kMaxMarks) m.marks_.pop_front();
  }
  restore.armed = false;
  end = m.read_;
  return n;
}

void Spool::commit(SpoolPosition end) {
  Impl& m = *self_;
  if (end <= m.cursor_) return;  // already acknowledged
  std::size_t idx = m.find(end.segment);
  if (idx == m.segments_.size() || end.offset > m.segments_[idx].size)
    throw SpoolError("spool position " + std::to_string(end.segment) + ":" + std::to_string(end.offset) +
                     " is not in " + m.opt_.dir.string() + ": pass a position that read() returned");
  std::uint64_t before = m.records_before(m.segments_[idx], end.offset);
  // The end of a closed segment is the start of the next one: then the segment goes too.
  while (end.offset == m.segments_[idx].size && idx + 1 < m.segments_.size()) {
    ++idx;
    end = {m.segments_[idx].number, 0};
    before = 0;
  }
  m.write_cursor({end.segment, end.offset, m.superseded_}, false);

  for (std::size_t i = 0; i < idx; ++i) {
    Segment& s = m.segments_[i];
    m.total_size_ -= s.size;
    m.total_records_ -= s.records;
    m.close_fd(s);
    std::erase(m.unsynced_, s.number);
    m.remove_file(s.path);
  }
  m.segments_.erase(m.segments_.begin(), m.segments_.begin() + static_cast<std::ptrdiff_t>(idx));
  m.cursor_ = end;
  m.cursor_before_ = before;
  if (m.read_ < end) {
    m.read_ = end;
    m.read_before_ = before;
  }
  while (!m.marks_.empty() && m.marks_.front().pos <= end) m.marks_.pop_front();
}

void Spool::rewind() noexcept {
  self_->read_ = self_->cursor_;
  self_->read_before_ = self_->cursor_before_;
}

void Spool::sync() {
  Impl& m = *self_;
  for (std::uint64_t number : m.unsynced_) {
    const std::size_t i = m.find(number);
    if (i == m.segments_.size()) continue;  // acknowledged and deleted meanwhile
    Segment& s = m.segments_[i];
    const bool was_open = static_cast<bool>(s.fd);
    if (::fdatasync(m.fd_of(s)) != 0) m.fail("cannot sync spool segment " + s.path.string(), errno);
    if (!was_open) m.close_fd(s);
  }
  m.unsynced_.clear();
  if (!m.segments_.empty() && m.segments_.back().fd) {
    Segment& t = m.segments_.back();
    if (::fdatasync(t.fd.get()) != 0) m.fail("cannot sync spool segment " + t.path.string(), errno);
  }
  if (m.dir_dirty_) {
    if (int err = fsync_dir(m.opt_.dir)) m.fail("cannot sync spool directory " + m.opt_.dir.string(), err);
    m.dir_dirty_ = false;
  }
}

bool Spool::has_unread() const noexcept {
  const Impl& m = *self_;
  for (std::size_t i = m.find(m.read_.segment); i < m.segments_.size(); ++i) {
    const Segment& s = m.segments_[i];
    if (s.number == m.read_.segment ? m.read_.offset < s.size : s.size > 0) return true;
  }
  return false;
}

std::uint64_t Spool::bytes() const noexcept { return self_->total_size_ - self_->cursor_.offset; }

std::uint64_t Spool::records() const noexcept { return self_->total_records_ - self_->cursor_before_; }

std::uint64_t Spool::corrupt_records_skipped() const noexcept { return self_->corrupt_; }

}  // namespace diaspora::plugin
