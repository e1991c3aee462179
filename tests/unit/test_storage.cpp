// core's storage layer (diaspora/files.hpp, diaspora/records.hpp), on real files: the frame
// writer and the checking reader, torn and corrupt frames, segment names, the directory
// lock across descriptors, atomic replacement. The topic log and the spool build on these;
// their own tests (test_topic_log.cpp, test_spool.cpp) cover recovery end to end.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "diaspora/crc32c.hpp"
#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "diaspora/records.hpp"
#include "test_helpers.hpp"

namespace fs = std::filesystem;
namespace st = diaspora::storage;
using diaspora::test::TempDir;

namespace {

// `bodies` framed one after another with seal_frame.
std::string framed(const std::vector<std::string>& bodies) {
  std::string out;
  for (const auto& b : bodies) {
    const std::size_t at = out.size();
    out.append(st::kFrameHeaderBytes, '\0');
    out += b;
    st::seal_frame(out.data() + at, static_cast<std::uint32_t>(b.size()));
  }
  return out;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// Reads every frame of `file` with CRC checks; returns the bodies and the last status.
std::vector<std::string> read_all(const fs::path& file, st::Frame::Status& last, std::uint64_t& end,
                                  std::size_t window = 7) {
  st::Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(fd);
  st::FileWindow w;
  w.reset(fd.get(), fs::file_size(file), window);
  std::vector<std::string> out;
  std::uint64_t pos = 0;
  for (;;) {
    st::Frame f = st::read_frame(w, pos, st::FrameLimits{}, true);
    last = f.status;
    if (f.status != st::Frame::Status::ok) break;
    out.emplace_back(f.body, f.length);
    pos += f.size();
  }
  end = pos;
  return out;
}

}  // namespace

TEST(Storage, FrameHeaderIsLengthThenCrcOfTheBody) {
  const std::string f = framed({"hello"});
  ASSERT_EQ(f.size(), 8u + 5u);
  EXPECT_EQ(st::get_u32(f.data()), 5u);
  EXPECT_EQ(st::get_u32(f.data() + 4), diaspora::crc32c("hello", 5));
  EXPECT_EQ(f.substr(8), "hello");
}

TEST(Storage, ReaderReturnsEveryFrameThroughASmallWindow) {
  TempDir d;
  const std::vector<std::string> bodies = {"a", std::string(100, 'b'), "ccc", std::string(3000, 'd')};
  write_bytes(d.path() / "f", framed(bodies));
  st::Frame::Status last{};
  std::uint64_t end = 0;
  EXPECT_EQ(read_all(d.path() / "f", last, end), bodies);
  EXPECT_EQ(last, st::Frame::Status::end);
  EXPECT_EQ(end, fs::file_size(d.path() / "f"));
}

TEST(Storage, TornTailIsTornAndEndsWhereTheGoodFramesEnd) {
  TempDir d;
  const std::string good = framed({"one", "two"});
  for (std::size_t cut : {3u, 8u, 10u}) {  // inside a header, right after one, inside a body
    const std::string torn = good + framed({"three"}).substr(0, cut);
    write_bytes(d.path() / "f", torn);
    st::Frame::Status last{};
    std::uint64_t end = 0;
    EXPECT_EQ(read_all(d.path() / "f", last, end), (std::vector<std::string>{"one", "two"})) << cut;
    EXPECT_EQ(last, st::Frame::Status::torn) << cut;
    EXPECT_EQ(end, good.size()) << cut;
  }
}

TEST(Storage, FlippedByteIsCorruptAndNeverReturned) {
  TempDir d;
  std::string bytes = framed({"one", "two", "three"});
  bytes[8 + 3 + 8 + 1] ^= 0x20;  // a byte of "two"'s body
  write_bytes(d.path() / "f", bytes);
  st::Frame::Status last{};
  std::uint64_t end = 0;
  EXPECT_EQ(read_all(d.path() / "f", last, end), (std::vector<std::string>{"one"}));
  EXPECT_EQ(last, st::Frame::Status::corrupt);
  EXPECT_EQ(end, 11u);
  // Counting what is lost follows the (intact) length fields: "two" and "three".
  st::Fd fd(::open((d.path() / "f").c_str(), O_RDONLY | O_CLOEXEC));
  st::FileWindow w;
  w.reset(fd.get(), bytes.size(), 64);
  EXPECT_EQ(st::count_lost_frames(w, end, end, st::FrameLimits{}), 2u);
}

TEST(Storage, LengthsOutsideTheLimitsAreCorrupt) {
  TempDir d;
  write_bytes(d.path() / "f", framed({"abc"}));
  st::Fd fd(::open((d.path() / "f").c_str(), O_RDONLY | O_CLOEXEC));
  st::FileWindow w;
  w.reset(fd.get(), 11, 64);
  EXPECT_EQ(st::read_frame(w, 0, st::FrameLimits{4, 100}, true).status, st::Frame::Status::corrupt);
  EXPECT_EQ(st::read_frame(w, 0, st::FrameLimits{1, 2}, true).status, st::Frame::Status::corrupt);
  const st::Frame ok = st::read_frame(w, 0, st::FrameLimits{3, 3}, true);
  EXPECT_EQ(ok.status, st::Frame::Status::ok);
  EXPECT_EQ(std::string(ok.body, ok.length), "abc");
  // A zero-filled stretch of disk is not a run of empty records: length 0 is below the minimum.
  write_bytes(d.path() / "z", std::string(64, '\0'));
  st::Fd z(::open((d.path() / "z").c_str(), O_RDONLY | O_CLOEXEC));
  w.reset(z.get(), 64, 64);
  EXPECT_EQ(st::read_frame(w, 0, st::FrameLimits{}, true).status, st::Frame::Status::corrupt);
}

TEST(Storage, SegmentNamesSortByNumberAndRejectOtherNames) {
  EXPECT_EQ(st::segment_name(42, ".log"), "00000000000000000042.log");
  EXPECT_EQ(st::parse_segment_name("00000000000000000042.log", ".log"), 42u);
  EXPECT_EQ(st::parse_segment_name("04611686018427387904.spool", ".spool"), st::kMaxSegmentNumber);
  // Beyond 2^62 a name is not a segment: the next number would wrap (found by fuzz.log).
  EXPECT_FALSE(st::parse_segment_name("04611686018427387905.spool", ".spool").has_value());
  EXPECT_FALSE(st::parse_segment_name("18446744073709551615.spool", ".spool").has_value());
  for (const char* bad : {"00000000000000000042.spool", "0000000000000000042.log", "+0000000000000000042.log",
                          "99999999999999999999.log", "0000000000000000004x.log", "00000000000000000042.log.tmp"})
    EXPECT_FALSE(st::parse_segment_name(bad, ".log").has_value()) << bad;
  TempDir d;
  for (std::uint64_t n : {10u, 2u, 300u}) write_bytes(d.path() / st::segment_name(n, ".log"), "");
  write_bytes(d.path() / "cursor", "");
  fs::create_directory(d.path() / st::segment_name(5, ".log"));  // not a regular file
  const auto segs = st::list_segments(d.path(), ".log");
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0].first, 2u);
  EXPECT_EQ(segs[1].first, 10u);
  EXPECT_EQ(segs[2].first, 300u);
  EXPECT_EQ(segs[2].second, d.path() / "00000000000000000300.log");
}

TEST(Storage, DirectoryLockHasOneHolderAtATime) {
  TempDir d;
  int err = -1;
  st::Fd first = st::lock_directory(d.path(), err);
  ASSERT_TRUE(first);
  EXPECT_EQ(err, 0);
  st::Fd second = st::lock_directory(d.path(), err);  // another open file description
  EXPECT_FALSE(second);
  EXPECT_EQ(err, EWOULDBLOCK);
  first.reset();
  st::Fd third = st::lock_directory(d.path(), err);
  EXPECT_TRUE(third);
  EXPECT_EQ(err, 0);
  st::Fd missing = st::lock_directory(d.path() / "no" / "such", err);
  EXPECT_FALSE(missing);
  EXPECT_EQ(err, ENOENT);
}

TEST(Storage, AtomicWriteReplacesTheFileAtEveryDurability) {
  TempDir d;
  const fs::path p = d.path() / "state";
  for (auto dur : {diaspora::Durability::process, diaspora::Durability::file, diaspora::Durability::file_and_dir}) {
    const std::string text = "v" + std::to_string(static_cast<int>(dur));
    diaspora::write_file_atomic(p, text, 0600, dur);
    EXPECT_EQ(diaspora::test::read_file(p), text);
    EXPECT_FALSE(fs::exists(d.path() / "state.tmp"));
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  }
  // A directory that does not exist: an error naming the file, nothing left behind.
  try {
    diaspora::write_file_atomic(d.path() / "no" / "f", "x");
    FAIL() << "wrote into a missing directory";
  } catch (const diaspora::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/f.tmp"), std::string::npos) << e.what();
  }
}

TEST(Storage, PreadPastTheEndIsEio) {
  TempDir d;
  write_bytes(d.path() / "f", "12345");
  st::Fd fd(::open((d.path() / "f").c_str(), O_RDONLY | O_CLOEXEC));
  char buf[8];
  EXPECT_EQ(st::pread_all(fd.get(), buf, 5, 0), 0);
  EXPECT_EQ(st::pread_all(fd.get(), buf, 6, 0), EIO);
  EXPECT_EQ(st::errno_text(ENOENT), "No such file or directory");
}
