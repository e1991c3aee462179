// The plugin's on-disk spool: order across segments, the durable cursor, recovery from torn
// and corrupt segments, prepend() and its crash windows, the soft size bound, the directory
// lock, write errors, and a SIGKILL in the middle of appending.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <deque>
#include <optional>
#include <random>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "spool.hpp"
#include "test_helpers.hpp"

namespace fs = std::filesystem;
using diaspora::plugin::Spool;
using diaspora::plugin::SpoolError;
using diaspora::plugin::SpoolOptions;
using diaspora::plugin::SpoolPosition;
using diaspora::plugin::SpoolRecords;
using diaspora::test::TempDir;

namespace {

SpoolOptions options(const fs::path& dir, std::uint64_t segment_bytes = 4ull << 20) {
  SpoolOptions o;
  o.dir = dir;
  o.segment_bytes = segment_bytes;
  return o;
}

std::string numbered(int i, std::size_t width = 0) {
  std::string s = "{\"n\":" + std::to_string(i) + "}";
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::vector<std::string> numbers(int from, int to, std::size_t width = 0) {
  std::vector<std::string> out;
  for (int i = from; i < to; ++i) out.push_back(numbered(i, width));
  return out;
}

std::size_t append(Spool& s, const std::vector<std::string>& records, bool droppable = false) {
  std::vector<std::string_view> views(records.begin(), records.end());
  return s.append(views, droppable);
}

std::size_t append_each(Spool& s, const std::vector<std::string>& records) {
  std::size_t n = 0;
  for (const auto& r : records) n += append(s, {r});
  return n;
}

void prepend(Spool& s, const std::vector<std::string>& records) {
  std::vector<std::string_view> views(records.begin(), records.end());
  s.prepend(views);
}

// Reads up to max_records; `end` gets the position after them.
std::vector<std::string> read(Spool& s, std::size_t max_records, SpoolPosition& end) {
  std::vector<std::string> out;
  const std::size_t n = s.read(out, max_records, 1 << 20, end);
  EXPECT_EQ(n, out.size());
  return out;
}

std::vector<std::string> read(Spool& s, std::size_t max_records) {
  SpoolPosition end;
  return read(s, max_records, end);
}

// Everything unread, in batches of 3 (so batches cross segment boundaries).
std::vector<std::string> read_all(Spool& s) {
  std::vector<std::string> out;
  SpoolPosition end;
  while (s.read(out, 3, 1 << 20, end) > 0) {
  }
  EXPECT_FALSE(s.has_unread());
  return out;
}

std::vector<fs::path> segment_files(const fs::path& dir) { return diaspora::test::files_in(dir, ".spool"); }

void flip_byte(const fs::path& file, std::uint64_t pos) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(pos));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(pos));
  f.put(static_cast<char>(c ^ 0x5a));
}

void write_file(const fs::path& file, const std::string& bytes) {
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  f << bytes;
}

void append_to_file(const fs::path& file, std::string_view bytes) {
  std::ofstream f(file, std::ios::binary | std::ios::app);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Bytes one record takes on disk.
std::uint64_t on_disk(const std::string& payload) { return 8 + payload.size(); }

}  // namespace

// ---- append / read / commit -----------------------------------------------------------

TEST(Spool, AppendReadCommitInOrderAcrossSegments) {
  TempDir dir;
  const auto records = numbers(0, 50, 40);
  const std::uint64_t rec = on_disk(records[0]);
  Spool s(options(dir.path(), 200));
  EXPECT_FALSE(s.has_unread());
  EXPECT_EQ(append_each(s, records), 50u);
  EXPECT_EQ(s.records(), 50u);
  EXPECT_EQ(s.bytes(), 50 * rec);
  EXPECT_TRUE(s.has_unread());

  const auto files = segment_files(dir.path());
  ASSERT_EQ(files.size(), 10u);  // a segment closes once it reaches 200 bytes: 5 records of 48
  EXPECT_EQ(files[0].filename(), "00000001099511627776.spool");
  EXPECT_EQ(fs::file_size(files[0]), 5 * rec);

  std::vector<std::string> got;
  SpoolPosition last;
  for (std::size_t left = 50; left > 0;) {
    SpoolPosition end;
    auto batch = read(s, 7, end);
    ASSERT_FALSE(batch.empty());
    EXPECT_GT(end, last);
    last = end;
    got.insert(got.end(), batch.begin(), batch.end());
    s.commit(end);
    left -= batch.size();
    EXPECT_EQ(s.records(), left);
    EXPECT_EQ(s.bytes(), left * rec);
  }
  EXPECT_EQ(got, records);
  EXPECT_FALSE(s.has_unread());
  EXPECT_TRUE(read(s, 10).empty());
  // Acknowledged segments are gone; the tail stays for the next append.
  EXPECT_EQ(segment_files(dir.path()).size(), 1u);
  EXPECT_EQ(append(s, {"x"}), 1u);
  EXPECT_EQ(read(s, 10), std::vector<std::string>{"x"});
}

TEST(Spool, ReadHonoursItsLimits) {
  TempDir dir;
  Spool s(options(dir.path()));
  const std::string big(5000, 'b');
  append(s, {"a1", "a2", "a3", big, "c1"});
  std::vector<std::string> out;
  SpoolPosition end;
  EXPECT_EQ(s.read(out, 0, 1 << 20, end), 0u);
  EXPECT_EQ(s.read(out, 2, 1 << 20, end), 2u);
  EXPECT_EQ(out, (std::vector<std::string>{"a1", "a2"}));
  out.clear();
  EXPECT_EQ(s.read(out, 10, 100, end), 1u);  // the big one does not fit after a3
  EXPECT_EQ(out, std::vector<std::string>{"a3"});
  out.clear();
  EXPECT_EQ(s.read(out, 10, 100, end), 1u);  // but comes alone, larger than max_bytes
  EXPECT_EQ(out, std::vector<std::string>{big});
  out = {"kept"};
  EXPECT_EQ(s.read(out, 10, 100, end), 1u);  // appends to `out`
  EXPECT_EQ(out, (std::vector<std::string>{"kept", "c1"}));
  EXPECT_EQ(s.records(), 5u);  // nothing committed
}

TEST(Spool, ReopenAfterCommitResumesAtTheCursor) {
  TempDir dir;
  const auto records = numbers(0, 30, 40);
  {
    Spool s(options(dir.path(), 200));
    append_each(s, records);
    SpoolPosition end;
    ASSERT_EQ(read(s, 12, end).size(), 12u);
    s.commit(end);
    EXPECT_EQ(read(s, 5).size(), 5u);  // read, not committed: replayed after the restart
  }
  Spool s(options(dir.path(), 200));
  EXPECT_EQ(s.records(), 18u);
  EXPECT_EQ(s.bytes(), 18 * on_disk(records[0]));
  EXPECT_EQ(read_all(s), numbers(12, 30, 40));
  EXPECT_EQ(s.corrupt_records_skipped(), 0u);
}

TEST(Spool, ReopenWithoutCommitReplaysEverything) {
  TempDir dir;
  const auto records = numbers(0, 30, 40);
  {
    Spool s(options(dir.path(), 200));
    append_each(s, records);
    EXPECT_EQ(read_all(s), records);
  }
  Spool s(options(dir.path(), 200));
  EXPECT_EQ(s.records(), 30u);
  EXPECT_EQ(read_all(s), records);
  // Appends continue after a reopen, in order.
  append(s, {"after"});
  s.rewind();
  auto all = read_all(s);
  ASSERT_EQ(all.size(), 31u);
  EXPECT_EQ(all.back(), "after");
}

TEST(Spool, RewindAndCommitPositions) {
  TempDir dir;
  Spool s(options(dir.path(), 100));
  append_each(s, numbers(0, 20));
  SpoolPosition first, second;
  EXPECT_EQ(read(s, 5, first), numbers(0, 5));
  EXPECT_EQ(read(s, 5, second), numbers(5, 10));
  s.commit(first);
  EXPECT_EQ(s.records(), 15u);
  s.rewind();
  EXPECT_EQ(read(s, 2), numbers(5, 7));
  // An older position is ignored; a later one that read() cannot have returned is refused.
  s.commit(first);
  s.commit(SpoolPosition{1, 0});
  EXPECT_EQ(s.records(), 15u);
  EXPECT_THROW(s.commit(SpoolPosition{first.segment, first.offset + 3}), SpoolError);
  EXPECT_THROW(s.commit(SpoolPosition{~0ull, 0}), SpoolError);
  EXPECT_EQ(s.records(), 15u);
  // Committing ahead of the read position (after a rewind) moves it along.
  s.rewind();
  s.commit(second);
  EXPECT_EQ(s.records(), 10u);
  EXPECT_EQ(read(s, 1), numbers(10, 11));
  // A position committed after other reads still counts records exactly.
  SpoolPosition third;
  read(s, 3, third);
  read(s, 3);
  s.commit(third);
  EXPECT_EQ(s.records(), 6u);
  s.rewind();
  EXPECT_EQ(read_all(s), numbers(14, 20));
}

// ---- recovery -------------------------------------------------------------------------

TEST(Spool, RecoveryTruncatesATornTail) {
  TempDir dir;
  const auto records = numbers(0, 10, 30);
  {
    Spool s(options(dir.path()));
    append_each(s, records);
  }
  const fs::path seg = segment_files(dir.path()).at(0);
  const auto size = fs::file_size(seg);
  fs::resize_file(seg, size - 5);  // the process died inside the last write()
  {
    Spool s(options(dir.path()));
    EXPECT_EQ(fs::file_size(seg), size - on_disk(records[9]));
    EXPECT_EQ(s.records(), 9u);
    EXPECT_EQ(s.corrupt_records_skipped(), 0u);  // an append that never returned, not damage
    EXPECT_EQ(read_all(s), numbers(0, 9, 30));
    append(s, {"again"});
  }
  append_to_file(seg, std::string_view("\x10\x00\x00", 3));  // a partial record header
  Spool s(options(dir.path()));
  auto all = read_all(s);
  ASSERT_EQ(all.size(), 10u);
  EXPECT_EQ(all.back(), "again");
}

TEST(Spool, RecoveryTruncatesGarbageAfterTheLastRecord) {
  TempDir dir;
  {
    Spool s(options(dir.path()));
    append_each(s, numbers(0, 5));
  }
  const fs::path seg = segment_files(dir.path()).at(0);
  const auto size = fs::file_size(seg);
  append_to_file(seg, "this is not a spool record at all");
  {
    std::vector<std::string> lines;
    SpoolOptions o = options(dir.path());
    o.log = [&lines](const std::string& line) { lines.push_back(line); };
    Spool s(o);
    EXPECT_EQ(fs::file_size(seg), size);
    EXPECT_EQ(s.records(), 5u);
    EXPECT_EQ(s.corrupt_records_skipped(), 1u);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("truncated"), std::string::npos) << lines[0];
    append(s, {"next"});
  }
  Spool s(options(dir.path()));
  auto expected = numbers(0, 5);
  expected.push_back("next");
  EXPECT_EQ(read_all(s), expected);
}

TEST(Spool, RecoveryTruncatesTheLastSegmentAtACorruptRecord) {
  TempDir dir;
  const auto records = numbers(0, 10, 40);
  const std::uint64_t rec = on_disk(records[0]);
  {
    Spool s(options(dir.path()));
    append_each(s, records);
  }
  const fs::path seg = segment_files(dir.path()).at(0);
  flip_byte(seg, 7 * rec + 20);  // inside record 7's payload
  Spool s(options(dir.path()));
  EXPECT_EQ(fs::file_size(seg), 7 * rec);
  EXPECT_EQ(s.corrupt_records_skipped(), 3u);  // 7, and 8 and 9 behind it
  EXPECT_EQ(read_all(s), numbers(0, 7, 40));
}

TEST(Spool, RecoverySkipsTheRestOfAnEarlierSegmentAndCountsIt) {
  TempDir dir;
  const auto records = numbers(0, 15, 40);
  const std::uint64_t rec = on_disk(records[0]);
  {
    Spool s(options(dir.path(), 5 * rec));
    append_each(s, records);
  }
  const auto files = segment_files(dir.path());
  ASSERT_EQ(files.size(), 3u);
  flip_byte(files[1], 2 * rec + 20);  // record 7 (the middle segment's third)
  {
    Spool s(options(dir.path(), 5 * rec));
    EXPECT_EQ(s.corrupt_records_skipped(), 3u);  // 7, 8, 9
    EXPECT_EQ(s.records(), 12u);
    EXPECT_EQ(fs::file_size(files[1]), 5 * rec);  // only the last segment is ever truncated
    auto expected = numbers(0, 7, 40);
    for (auto& r : numbers(10, 15, 40)) expected.push_back(r);
    EXPECT_EQ(read_all(s), expected);
  }
  // A flipped length field is caught too (as an impossible length or by the next CRC).
  flip_byte(files[0], 1 * rec + 3);
  Spool s(options(dir.path(), 5 * rec));
  // 3 in the middle segment again, 1 in the first: past a bad length field the records
  // cannot be delimited, so the count is a lower bound there.
  EXPECT_EQ(s.corrupt_records_skipped(), 4u);
  const auto all = read_all(s);
  ASSERT_EQ(all.size(), 1u + 2u + 5u);
  EXPECT_EQ(all[0], records[0]);
  EXPECT_EQ(all[1], records[5]);
  EXPECT_EQ(all.back(), records[14]);
}

TEST(Spool, ReadNeverReturnsARecordDamagedAfterRecovery) {
  TempDir dir;
  const auto records = numbers(0, 10, 40);
  const std::uint64_t rec = on_disk(records[0]);
  const SpoolOptions o = options(dir.path(), 5 * rec);
  {
    Spool s(o);
    append_each(s, records);
    const auto files = segment_files(dir.path());
    ASSERT_EQ(files.size(), 2u);
    flip_byte(files[0], 3 * rec + 20);  // record 3, under the running spool
    flip_byte(files[1], 1 * rec + 20);  // record 6, in the tail
    EXPECT_EQ(read_all(s), (std::vector<std::string>{records[0], records[1], records[2], records[5]}));
    EXPECT_EQ(s.corrupt_records_skipped(), 2u + 4u);
    EXPECT_EQ(s.records(), 4u);
    // Appends after a damaged tail go to a new segment, behind the damage.
    append(s, {"after"});
    EXPECT_EQ(segment_files(dir.path()).size(), 3u);
    EXPECT_EQ(read_all(s), std::vector<std::string>{"after"});
  }
  Spool s(o);
  EXPECT_EQ(read_all(s), (std::vector<std::string>{records[0], records[1], records[2], records[5], "after"}));
  EXPECT_EQ(s.records(), 5u);
}

TEST(Spool, DamagedCursorReplaysFromTheOldestSegment) {
  TempDir dir;
  {
    Spool s(options(dir.path(), 100));
    append_each(s, numbers(0, 10));
    SpoolPosition end;
    read(s, 4, end);
    s.commit(end);
  }
  const fs::path cursor = dir.path() / "cursor";
  std::string text = diaspora::test::read_file(cursor);
  ASSERT_FALSE(text.empty());
  text[text.size() / 2] ^= 1;
  write_file(cursor, text);
  std::vector<std::string> lines;
  SpoolOptions o = options(dir.path(), 100);
  o.log = [&lines](const std::string& line) { lines.push_back(line); };
  {
    Spool s(o);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("damaged"), std::string::npos) << lines[0];
    // Re-delivery from the oldest segment still on disk, never loss.
    const auto all = read_all(s);
    ASSERT_GE(all.size(), 6u);
    EXPECT_EQ(std::vector<std::string>(all.end() - 6, all.end()), numbers(4, 10));
    EXPECT_EQ(s.records(), all.size());
  }
  // The cursor was rewritten: no complaint the second time.
  lines.clear();
  Spool s(o);
  EXPECT_TRUE(lines.empty());
}

TEST(Spool, LeavesForeignFilesAlone) {
  TempDir dir;
  const std::vector<std::string> foreign = {"notes.txt", "123.spool", "0000000000000000000a.spool",
                                            "99999999999999999999.spool", "00000000000000000000.spool",
                                            "00000001099511627776.spool.bak"};
  for (const auto& name : foreign) write_file(dir.path() / name, "not mine");
  write_file(dir.path() / "cursor.tmp", "a cursor write that never finished");  // replaced, not read
  {
    Spool s(options(dir.path()));
    append(s, {"r"});
    SpoolPosition end;
    read(s, 10, end);
    s.commit(end);
    EXPECT_EQ(s.corrupt_records_skipped(), 0u);
  }
  Spool s(options(dir.path()));
  EXPECT_EQ(s.records(), 0u);
  for (const auto& name : foreign) EXPECT_TRUE(fs::exists(dir.path() / name)) << name;
}

// ---- prepend --------------------------------------------------------------------------

TEST(Spool, PrependAfterAPartialCommitKeepsOrderAndSurvivesAReopen) {
  TempDir dir;
  std::vector<std::string> expected = {"p0", "p1"};
  for (auto& r : numbers(5, 20)) expected.push_back(r);
  {
    Spool s(options(dir.path(), 100));
    append_each(s, numbers(0, 20));
    SpoolPosition five;
    read(s, 5, five);
    read(s, 3);  // in flight when the connection dropped
    s.commit(five);
    prepend(s, {"p0", "p1"});
    EXPECT_EQ(s.records(), 17u);
    EXPECT_EQ(read_all(s), expected);
    const auto files = segment_files(dir.path());
    EXPECT_LT(files.front().filename().string(), "00000001099511627776.spool");
  }
  {
    Spool s(options(dir.path(), 100));
    EXPECT_EQ(s.records(), 17u);
    EXPECT_EQ(read_all(s), expected);
    // A second prepend after committing into the prepended segment.
    s.rewind();
    SpoolPosition end;
    read(s, 1, end);
    s.commit(end);
    prepend(s, {"q"});
    append(s, {"tail"});
  }
  Spool s(options(dir.path(), 100));
  std::vector<std::string> again = {"q", "p1"};
  again.insert(again.end(), expected.begin() + 2, expected.end());
  again.push_back("tail");
  EXPECT_EQ(read_all(s), again);
  EXPECT_EQ(s.records(), again.size());
}

TEST(Spool, PrependToAnEmptySpoolAndToASingleSegment) {
  TempDir dir;
  {
    Spool s(options(dir.path()));
    prepend(s, {"a"});
    append(s, {"b"});
    prepend(s, {"z"});  // the head is also the tail
    append(s, {"c"});
    EXPECT_EQ(read_all(s), (std::vector<std::string>{"z", "a", "b", "c"}));
    EXPECT_EQ(segment_files(dir.path()).size(), 1u);
  }
  Spool s(options(dir.path()));
  EXPECT_EQ(read_all(s), (std::vector<std::string>{"z", "a", "b", "c"}));
}

TEST(Spool, PrependCrashWindowsNeitherLoseNorDuplicate) {
  TempDir dir;
  const auto records = numbers(0, 10, 40);
  const std::uint64_t rec = on_disk(records[0]);
  const SpoolOptions o = options(dir.path(), 5 * rec);
  fs::path head;
  std::string head_bytes, old_cursor;
  {
    Spool s(o);
    append_each(s, records);
    SpoolPosition end;
    read(s, 3, end);
    s.commit(end);
    head = segment_files(dir.path()).at(0);
    head_bytes = diaspora::test::read_file(head);
    old_cursor = diaspora::test::read_file(dir.path() / "cursor");
    prepend(s, {"p"});
    EXPECT_FALSE(fs::exists(head));
  }
  std::vector<std::string> after = {"p"};
  for (int i = 3; i < 10; ++i) after.push_back(records[static_cast<std::size_t>(i)]);

  // Died after the cursor switch, before the old head was deleted.
  write_file(head, head_bytes);
  {
    Spool s(o);
    EXPECT_EQ(read_all(s), after);
    EXPECT_EQ(s.records(), after.size());
    EXPECT_FALSE(fs::exists(head));
  }
  // Died before the switch: the new head exists, the cursor still names the old one.
  write_file(head, head_bytes);
  write_file(dir.path() / "cursor", old_cursor);
  write_file(dir.path() / "cursor.tmp", "half-written");
  {
    Spool s(o);
    EXPECT_EQ(read_all(s), std::vector<std::string>(records.begin() + 3, records.end()));
    EXPECT_EQ(segment_files(dir.path()).front(), head);
  }
  Spool s(o);
  EXPECT_EQ(s.records(), 7u);
}

// ---- bounds, errors, locking ----------------------------------------------------------

TEST(Spool, DroppableRecordsAreRefusedPastMaxBytes) {
  TempDir dir;
  SpoolOptions o = options(dir.path());
  o.max_bytes = 1000;
  Spool s(o);
  const std::string r100(92, 'r');  // 100 bytes on disk
  for (int i = 0; i < 9; ++i) ASSERT_EQ(append(s, {r100}), 1u);
  EXPECT_EQ(s.bytes(), 900u);
  EXPECT_EQ(append(s, {r100, std::string(10, 'm')}, true), 0u);  // all or none
  EXPECT_EQ(s.bytes(), 900u);
  EXPECT_EQ(append(s, {r100}, true), 1u);  // exactly at the bound
  EXPECT_EQ(append(s, {"m"}, true), 0u);
  EXPECT_EQ(append(s, {r100, r100}), 2u);  // events are never refused
  EXPECT_EQ(s.bytes(), 1200u);
  SpoolPosition end;
  read(s, 5, end);
  s.commit(end);
  EXPECT_EQ(s.bytes(), 700u);
  EXPECT_EQ(append(s, {"m"}, true), 1u);
  EXPECT_EQ(s.records(), 8u);
}

TEST(Spool, RejectsEmptyAndOversizedRecords) {
  TempDir dir;
  Spool s(options(dir.path()));
  append(s, {"first"});
  EXPECT_THROW(append(s, {"ok", ""}), SpoolError);
  EXPECT_THROW(append(s, {std::string((64u << 20) + 1, 'x')}), SpoolError);
  EXPECT_THROW(prepend(s, {""}), SpoolError);
  EXPECT_EQ(s.records(), 1u);
  EXPECT_EQ(read_all(s), std::vector<std::string>{"first"});
  EXPECT_THROW(Spool{SpoolOptions{}}, SpoolError);
}

// Records framed in place (what the plugin serialises into) read back like appended ones;
// an empty record is dropped, a cancelled one leaves nothing, an open one is not written.
TEST(Spool, RecordsFramedInPlaceReadBackInOrder) {
  TempDir dir;
  std::optional<Spool> held(std::in_place, options(dir.path(), 64));
  Spool& s = *held;  // small segments: the framed bytes still roll over
  SpoolRecords r;
  for (int i = 0; i < 5; ++i) {
    r.begin() += numbered(i);
    r.end();
  }
  r.begin();  // left empty: dropped
  r.end();
  r.begin() += "half-written";
  r.cancel();
  r.begin() += numbered(5);  // a begin() ends the record before it
  r.begin() += numbered(6);
  EXPECT_EQ(r.count(), 6u);  // the open one is not counted
  EXPECT_EQ(s.append(r), 6u);
  EXPECT_EQ(s.records(), 6u);
  r.end();
  EXPECT_EQ(r.count(), 7u);
  EXPECT_EQ(s.bytes(), 6 * on_disk(numbered(0)));
  r.clear();
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(s.append(r), 0u);
  r.begin() += numbered(6);
  r.end();
  EXPECT_EQ(s.append(r, true), 1u);
  EXPECT_EQ(read_all(s), numbers(0, 7));
  held.reset();  // releases the directory's lock
  // The framing is the spool's own: recovery on reopen checks every CRC and keeps them all.
  Spool again(options(dir.path(), 64));
  EXPECT_EQ(again.corrupt_records_skipped(), 0u);
  EXPECT_EQ(read_all(again), numbers(0, 7));
}

TEST(Spool, RecordsFramedInPlaceRefuseAnOversizedPayload) {
  SpoolRecords r;
  r.begin() += "kept";
  r.end();
  r.begin().append((64u << 20) + 1, 'x');
  EXPECT_THROW(r.end(), SpoolError);
  EXPECT_EQ(r.count(), 1u);
  TempDir dir;
  Spool s(options(dir.path()));
  EXPECT_EQ(s.append(r), 1u);
  EXPECT_EQ(read_all(s), std::vector<std::string>{"kept"});
}

TEST(Spool, DroppableFramedRecordsHonourMaxBytes) {
  TempDir dir;
  SpoolOptions o = options(dir.path());
  o.max_bytes = 100;
  Spool s(o);
  SpoolRecords r;
  r.begin().append(92, 'm');  // 100 bytes on disk
  r.end();
  r.begin() += "m";
  r.end();
  EXPECT_EQ(s.append(r, true), 0u);  // all or none
  EXPECT_EQ(s.append(r), 2u);        // events are never refused
  EXPECT_EQ(s.records(), 2u);
}

// A sink that throws (out of memory in the caller's batch) leaves the read position where it
// was: the same records come again, none is skipped.
TEST(Spool, ReadIntoASinkThatThrowsReadsTheSameRecordsAgain) {
  TempDir dir;
  Spool s(options(dir.path(), 64));
  ASSERT_EQ(append(s, numbers(0, 8)), 8u);
  EXPECT_EQ(read(s, 2), numbers(0, 2));
  std::vector<std::string> got;
  SpoolPosition end;
  EXPECT_THROW(s.read([&](std::string_view r) {
                 if (got.size() == 3) throw std::bad_alloc();
                 got.emplace_back(r);
               }, 10, 1 << 20, end),
               std::bad_alloc);
  EXPECT_EQ(got, numbers(2, 5));
  got.clear();
  EXPECT_EQ(s.read([&](std::string_view r) { got.emplace_back(r); }, 10, 1 << 20, end), 6u);
  EXPECT_EQ(got, numbers(2, 8));
  s.commit(end);
  EXPECT_EQ(s.records(), 0u);
}

TEST(Spool, SecondSpoolOnTheSameDirectoryThrows) {
  TempDir dir;
  {
    Spool s(options(dir.path()));
    try {
      Spool other(options(dir.path()));
      FAIL() << "a second Spool opened a locked directory";
    } catch (const SpoolError& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by another process"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << e.what();
    }
  }
  Spool s(options(dir.path()));  // released by the destructor
}

TEST(Spool, WriteErrorWritesNothing) {
  TempDir dir;
  Spool s(options(dir.path()));
  append(s, {numbered(0, 100)});
  const fs::path seg = segment_files(dir.path()).at(0);
  const auto size = fs::file_size(seg);

  // A file size limit stops the next write part-way with EFBIG, like a full disk.
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit low = old;
  low.rlim_cur = size + 50;
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  EXPECT_THROW(append(s, {numbered(1, 100), numbered(2, 100)}), SpoolError);
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(fs::file_size(seg), size);
  EXPECT_EQ(s.records(), 1u);
  EXPECT_EQ(append(s, {numbered(1, 100), numbered(2, 100)}), 2u);
  s.sync();
  EXPECT_EQ(read_all(s), numbers(0, 3, 100));
}

TEST(Spool, SyncAfterSegmentsRolled) {
  TempDir dir;
  Spool s(options(dir.path(), 100));
  append_each(s, numbers(0, 30));
  EXPECT_NO_THROW(s.sync());
  SpoolPosition end;
  read(s, 10, end);
  s.commit(end);
  append(s, {"more"});
  EXPECT_NO_THROW(s.sync());
  EXPECT_EQ(s.records(), 21u);
}

// ---- a killed process ------------------------------------------------------------------

TEST(Spool, EveryAppendedRecordSurvivesSigkill) {
  TempDir dir;
  constexpr int kAppended = 10000;
  constexpr int kCommitted = 1000;
  auto record = [](int i) { return numbered(i, static_cast<std::size_t>(i * 37 % 300)); };
  const SpoolOptions o = options(dir.path(), 64u << 10);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: no gtest here; any failure is an exit code the parent reports.
    try {
      Spool s(o);
      for (int i = 0;; ++i) {
        if (i == kAppended) std::raise(SIGKILL);  // mid-loop: no destructor, no sync
        const std::string r = record(i);
        const std::string_view v = r;
        if (s.append(std::span<const std::string_view>(&v, 1)) != 1) ::_exit(2);
        if (i == 2 * kCommitted) {
          std::vector<std::string> out;
          SpoolPosition end;
          if (s.read(out, kCommitted, 1 << 30, end) != kCommitted) ::_exit(3);
          s.commit(end);
        }
      }
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  Spool s(o);
  EXPECT_EQ(s.records(), static_cast<std::uint64_t>(kAppended - kCommitted));
  EXPECT_EQ(s.corrupt_records_skipped(), 0u);
  std::vector<std::string> out;
  SpoolPosition end;
  while (s.read(out, 500, 1 << 20, end) > 0) {
  }
  ASSERT_EQ(out.size(), static_cast<std::size_t>(kAppended - kCommitted));
  for (int i = kCommitted; i < kAppended; ++i)
    ASSERT_EQ(out[static_cast<std::size_t>(i - kCommitted)], record(i)) << i;
}

// The plugin's usage pattern, randomised: appends interleaved with batched reads, acks
// (commits) of earlier reads in order, rewinds and prepends, over many small segments.
// A model says what must be unread and in which order; records() must count exactly
// what is not yet committed, and has_unread() must be true while anything is unread.
TEST(Spool, RandomisedAppendReadCommitAgreesWithAModel) {
  TempDir dir;
  Spool spool(options(dir.path(), 2048));
  std::mt19937 rng(11);
  std::deque<std::string> model;  // committed < ... : every record not yet committed, in order
  std::size_t unread_from = 0;    // index into model of the first unread record
  std::deque<std::pair<SpoolPosition, std::size_t>> reads;  // (end, records) not yet committed
  int next = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {  // append 1..5 records
      std::vector<std::string> recs;
      for (int k = 0, n = 1 + static_cast<int>(rng() % 5); k < n; ++k)
        recs.push_back("r" + std::to_string(next++) + std::string(rng() % 300, 'x'));
      std::vector<std::string_view> v(recs.begin(), recs.end());
      spool.append(v);
      for (auto& r : recs) model.push_back(r);
    } else if (op < 7) {  // read a batch
      std::vector<std::string> out;
      SpoolPosition end;
      const std::size_t n = spool.read(out, 1 + rng() % 6, 1000, end);
      ASSERT_EQ(n, out.size());
      for (std::size_t k = 0; k < n; ++k) ASSERT_EQ(out[k], model[unread_from + k]) << "step " << step;
      if (n) reads.emplace_back(end, n);
      unread_from += n;
    } else if (op < 9) {  // ack the oldest read batch
      if (!reads.empty()) {
        spool.commit(reads.front().first);
        for (std::size_t k = 0; k < reads.front().second; ++k) model.pop_front();
        unread_from -= reads.front().second;
        reads.pop_front();
      }
    } else {  // the connection drops: everything unacked is read again
      spool.rewind();
      reads.clear();
      unread_from = 0;
    }
    ASSERT_EQ(spool.records(), model.size()) << "step " << step;
    ASSERT_EQ(spool.has_unread(), unread_from < model.size()) << "step " << step;
  }
}
