// The relay's topic log: CRC32C, append/read, group commit under concurrency, de-dupe,
// segments and the sparse index, crash recovery, retention and consumer-group offsets.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "test_helpers.hpp"
#include "diaspora/crc32c.hpp"
#include "topic_log.hpp"

namespace fs = std::filesystem;
using diaspora::relay::AppendRecord;
using diaspora::relay::AppendResult;
using diaspora::relay::FsyncPolicy;
using diaspora::relay::LogOptions;
using diaspora::relay::LogStore;
using diaspora::relay::Retention;
using diaspora::relay::any_bounded;
using diaspora::relay::retention_of;
using diaspora::relay::StoredRecord;
using diaspora::test::TempDir;

namespace {

LogOptions options(const fs::path& dir, const char* fsync = "never") {
  LogOptions o;
  o.data_dir = dir;
  o.fsync = FsyncPolicy::parse(fsync);
  return o;
}

AppendResult append_sync(LogStore& s, const std::string& topic, const std::string& producer, std::uint64_t seq,
                         std::vector<AppendRecord> records) {
  std::promise<AppendResult> p;
  auto f = p.get_future();
  s.append(topic, producer, seq, std::move(records), [&p](const AppendResult& r) { p.set_value(r); });
  return f.get();
}

std::vector<AppendRecord> payloads(const std::vector<std::string>& texts) {
  std::vector<AppendRecord> out;
  for (const auto& t : texts) out.push_back({"", t});
  return out;
}

std::vector<AppendRecord> keyed(const std::vector<std::string>& keys) {
  std::vector<AppendRecord> out;
  for (const auto& k : keys) out.push_back({k, "{\"id\":\"" + k + "\"}"});
  return out;
}

std::vector<std::string> texts(const std::vector<StoredRecord>& recs) {
  std::vector<std::string> out;
  for (const auto& r : recs) out.push_back(r.payload);
  return out;
}

std::string numbered(int i, std::size_t width = 0) {
  std::string s = "{\"n\":" + std::to_string(i) + "}";
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::vector<fs::path> segment_files(const fs::path& data, const std::string& topic) {
  return diaspora::test::files_in(data / "topics" / topic, ".log");
}

// Overwrites one byte of a file.
void flip_byte(const fs::path& file, std::uint64_t pos) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(pos));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(pos));
  f.put(static_cast<char>(c ^ 0x5a));
}

// Bytes one record takes on disk (frame 8 + fixed fields 28 + variable fields).
std::uint64_t on_disk(const std::string& producer, const std::string& key, const std::string& payload) {
  return 36 + producer.size() + key.size() + payload.size();
}

}  // namespace

// ---- CRC32C ---------------------------------------------------------------------------

TEST(Crc32c, KnownVectors) {
  using diaspora::crc32c;
  using diaspora::detail::crc32c_portable;
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  // RFC 3720 (iSCSI) B.4 vectors.
  unsigned char buf[32];
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(crc32c(buf, 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c_portable(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xff, sizeof buf);
  EXPECT_EQ(crc32c(buf, 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c_portable(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf, 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c_portable(buf, 32), 0x46DD794Eu);
}

TEST(Crc32c, IncrementalAndUnalignedAgree) {
  using diaspora::crc32c;
  using diaspora::detail::crc32c_portable;
  std::mt19937 rng(7);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (std::size_t start = 0; start < 9; ++start) {
    for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 65u, 500u, 991u}) {
      const char* p = data.data() + start;
      const std::uint32_t whole = crc32c(p, len);
      ASSERT_EQ(whole, crc32c_portable(p, len)) << start << "+" << len;
      for (std::size_t cut : {std::size_t{0}, len / 3, len / 2, len}) {
        EXPECT_EQ(crc32c(p + cut, len - cut, crc32c(p, cut)), whole);
        EXPECT_EQ(crc32c_portable(p + cut, len - cut, crc32c_portable(p, cut)), whole);
      }
    }
  }
}

// ---- basics ---------------------------------------------------------------------------

TEST(TopicLog, AppendAndReadBack) {
  TempDir dir;
  LogStore s(options(dir.path(), "always"));
  EXPECT_EQ(s.committed_offset("t"), 0u);
  EXPECT_TRUE(s.read("t", 0, 10, 1 << 20).empty());

  auto r = append_sync(s, "t", "p", 1, payloads({"{\"a\":1}", "{\"a\":2}", "{\"a\":3}"}));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.first_offset, 0u);
  EXPECT_EQ(r.written, 3u);
  EXPECT_EQ(r.duplicates, 0u);
  EXPECT_FALSE(r.duplicate_batch);
  r = append_sync(s, "t", "p", 2, payloads({"{\"a\":4}"}));
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.first_offset, 3u);
  EXPECT_EQ(s.committed_offset("t"), 4u);
  EXPECT_EQ(s.first_offset("t"), 0u);

  auto recs = s.read("t", 0, 100, 1 << 20);
  ASSERT_EQ(recs.size(), 4u);
  for (std::size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].offset, i);
    EXPECT_EQ(recs[i].payload, "{\"a\":" + std::to_string(i + 1) + "}");
    EXPECT_GT(recs[i].time_us, 1'600'000'000'000'000);
  }
  // Limits: records, bytes (at least one), and from.
  EXPECT_EQ(s.read("t", 0, 2, 1 << 20).size(), 2u);
  EXPECT_EQ(s.read("t", 0, 100, 1).size(), 1u);
  EXPECT_EQ(s.read("t", 0, 100, 14).size(), 2u);
  EXPECT_EQ(s.read("t", 0, 0, 1 << 20).size(), 0u);
  EXPECT_EQ(texts(s.read("t", 2, 100, 1 << 20)), (std::vector<std::string>{"{\"a\":3}", "{\"a\":4}"}));
  EXPECT_TRUE(s.read("t", 4, 100, 1 << 20).empty());
  EXPECT_TRUE(s.read("other", 0, 100, 1 << 20).empty());

  EXPECT_EQ(s.topics(), std::vector<std::string>{"t"});
  auto info = s.info("t");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->next_offset, 4u);
  EXPECT_EQ(info->segments, 1u);
  EXPECT_EQ(info->bytes, fs::file_size(segment_files(dir.path(), "t").at(0)));
  EXPECT_FALSE(s.info("nope"));
  EXPECT_TRUE(s.verify().empty());
}

TEST(TopicLog, LayoutAndCommitListener) {
  TempDir dir;
  std::mutex mu;
  std::vector<std::pair<std::string, std::uint64_t>> seen;
  {
    LogStore s(options(dir.path(), "interval:20"));
    s.set_commit_listener([&](const std::string& t, std::uint64_t next) {
      std::lock_guard lk(mu);
      seen.emplace_back(t, next);
    });
    ASSERT_TRUE(append_sync(s, "alpha", "", 0, payloads({"1", "2"})).ok);
    ASSERT_TRUE(append_sync(s, "beta.x_y-z", "", 0, payloads({"1"})).ok);
    // Interval mode acks after write(); the records are readable at once.
    EXPECT_EQ(s.read("alpha", 0, 10, 1000).size(), 2u);
  }
  std::lock_guard lk(mu);
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, std::uint64_t>>{{"alpha", 2}, {"beta.x_y-z", 1}}));
  EXPECT_TRUE(fs::exists(dir.path() / "topics" / "alpha" / "00000000000000000000.log"));
  EXPECT_TRUE(fs::exists(dir.path() / "topics" / "beta.x_y-z" / "00000000000000000000.log"));
}

TEST(TopicLog, RejectsBadInput) {
  TempDir dir;
  LogStore s(options(dir.path()));
  auto r = append_sync(s, "t", std::string(70000, 'p'), 1, payloads({"{}"}));
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.error.empty());
  r = append_sync(s, "t", "p", 1, {{std::string(70000, 'k'), "{}"}});
  EXPECT_FALSE(r.ok);
  r = append_sync(s, "t", "p", 1, payloads({std::string(17u << 20, 'x')}));
  EXPECT_FALSE(r.ok);
  r = append_sync(s, "../evil", "p", 1, payloads({"{}"}));
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(fs::exists(dir.path() / "evil"));
  // Nothing was written by the refused batches; the topic still works and seq 1 is unused.
  r = append_sync(s, "t", "p", 1, payloads({"{}"}));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.first_offset, 0u);
  EXPECT_EQ(r.written, 1u);
}

TEST(TopicLog, ValidTopicNames) {
  using diaspora::relay::valid_topic_name;
  EXPECT_TRUE(valid_topic_name("a"));
  EXPECT_TRUE(valid_topic_name("events.v1_raw-2"));
  EXPECT_TRUE(valid_topic_name(std::string(200, 'x')));
  EXPECT_FALSE(valid_topic_name(std::string(201, 'x')));
  EXPECT_FALSE(valid_topic_name(""));
  EXPECT_FALSE(valid_topic_name(".hidden"));
  EXPECT_FALSE(valid_topic_name(".."));
  EXPECT_FALSE(valid_topic_name("a/b"));
  EXPECT_FALSE(valid_topic_name("a b"));
  EXPECT_FALSE(valid_topic_name("caf\xc3\xa9"));
  EXPECT_FALSE(valid_topic_name(std::string("a\0b", 3)));
}

TEST(TopicLog, FsyncPolicyParse) {
  EXPECT_EQ(FsyncPolicy::parse("always").mode, FsyncPolicy::Mode::always);
  EXPECT_EQ(FsyncPolicy::parse("never").mode, FsyncPolicy::Mode::never);
  auto p = FsyncPolicy::parse("interval:50");
  EXPECT_EQ(p.mode, FsyncPolicy::Mode::interval);
  EXPECT_EQ(p.interval, std::chrono::milliseconds(50));
  for (const char* bad : {"", "Always", "interval", "interval:", "interval:-5", "interval:5ms", "interval:x", "sometimes",
                          "interval:99999999999"})
    EXPECT_THROW(FsyncPolicy::parse(bad), diaspora::Error) << bad;
}

TEST(TopicLog, FsyncStatsCountSyncs) {
  TempDir dir;
  LogStore s(options(dir.path(), "always"));
  auto before = s.fsync_stats();
  EXPECT_EQ(before.count, 0u);
  ASSERT_EQ(before.bucket_bounds.size(), before.bucket_counts.size());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(append_sync(s, "t", "", 0, payloads({"{}"})).ok);
  auto st = s.fsync_stats();
  EXPECT_GE(st.count, 3u);
  EXPECT_GT(st.sum, 0.0);
  for (std::size_t i = 1; i < st.bucket_counts.size(); ++i) {
    EXPECT_LT(st.bucket_bounds[i - 1], st.bucket_bounds[i]);
    EXPECT_LE(st.bucket_counts[i - 1], st.bucket_counts[i]);  // cumulative
  }
  EXPECT_LE(st.bucket_counts.back(), st.count);
}

// interval mode acks at once and syncs in the background, off the writer's path; the
// last writes are synced when the store closes.
TEST(TopicLog, IntervalModeSyncsInTheBackground) {
  TempDir dir;
  std::atomic<int> syncs{0};
  LogOptions o = options(dir.path(), "interval:20");
  o.segment_sync = [&](int fd) {
    ++syncs;
    return ::fdatasync(fd);
  };
  {
    LogStore s(o);
    ASSERT_TRUE(append_sync(s, "t", "", 0, payloads({"a"})).ok);
    for (int i = 0; i < 200 && syncs.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GT(syncs.load(), 0);
    ASSERT_TRUE(append_sync(s, "t", "", 0, payloads({"b"})).ok);  // acked before any sync of it
    EXPECT_EQ(s.committed_offset("t"), 2u);
  }
  EXPECT_GE(syncs.load(), 2);  // the write of "b" was synced, at the latest when closing
}

// ---- concurrency ----------------------------------------------------------------------

void concurrent_appenders_keep_every_record_once_in_order(const char* fsync) {
  TempDir dir;
  LogOptions o = options(dir.path(), fsync);
  o.segment_bytes = 16 << 10;  // several rolls along the way
  LogStore s(o);
  constexpr int kThreads = 4, kBatches = 150, kPerBatch = 3;
  std::atomic<int> ok{0}, failed{0};
  std::mutex mu;
  std::condition_variable cv;
  int outstanding = kThreads * kBatches;
  // Completions run in append order (the syncers reveal groups in order), and an acked
  // batch is already readable when its completion runs.
  std::uint64_t last_end = 0;
  int out_of_order = 0, not_visible = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int b = 0; b < kBatches; ++b) {
        std::vector<AppendRecord> recs;
        for (int k = 0; k < kPerBatch; ++k)
          recs.push_back({"", std::to_string(t) + ":" + std::to_string(b * kPerBatch + k)});
        s.append("shared", "producer-" + std::to_string(t), static_cast<std::uint64_t>(b + 1), std::move(recs),
                 [&](const AppendResult& r) {
                   (r.ok && r.written == kPerBatch ? ok : failed)++;
                   const bool visible = s.committed_offset("shared") >= r.first_offset + r.written;
                   std::lock_guard lk(mu);
                   if (r.first_offset < last_end) ++out_of_order;
                   last_end = r.first_offset + r.written;
                   if (!visible) ++not_visible;
                   if (--outstanding == 0) cv.notify_all();
                 });
        // Readers run concurrently with the writer.
        if (b % 25 == 0) (void)s.read("shared", 0, 50, 1 << 20);
      }
    });
  }
  for (auto& th : threads) th.join();
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return outstanding == 0; }));
  }
  EXPECT_EQ(ok.load(), kThreads * kBatches);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(out_of_order, 0);
  EXPECT_EQ(not_visible, 0);
  constexpr std::uint64_t total = kThreads * kBatches * kPerBatch;
  EXPECT_EQ(s.committed_offset("shared"), total);

  std::vector<StoredRecord> all;
  for (std::uint64_t from = 0; from < total;) {
    auto part = s.read("shared", from, 97, 1 << 20);
    ASSERT_FALSE(part.empty());
    from = part.back().offset + 1;
    all.insert(all.end(), part.begin(), part.end());
  }
  ASSERT_EQ(all.size(), total);
  std::vector<int> next(kThreads, 0);
  for (std::size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].offset, i);
    const auto colon = all[i].payload.find(':');
    const int t = std::stoi(all[i].payload.substr(0, colon));
    const int n = std::stoi(all[i].payload.substr(colon + 1));
    EXPECT_EQ(n, next[t]) << "producer " << t << " out of order";
    next[t] = n + 1;
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next[t], kBatches * kPerBatch);
  EXPECT_GT(s.info("shared")->segments, 1u);
  EXPECT_TRUE(s.verify().empty());
}

TEST(TopicLog, ConcurrentAppendersKeepEveryRecordOnceInOrder) {
  for (const char* fsync : {"always", "interval:2", "never"}) {
    SCOPED_TRACE(fsync);
    concurrent_appenders_keep_every_record_once_in_order(fsync);
  }
}

// ---- de-dupe --------------------------------------------------------------------------

TEST(TopicLog, BatchDedupeSurvivesReopen) {
  TempDir dir;
  {
    LogStore s(options(dir.path()));
    ASSERT_TRUE(append_sync(s, "t", "p1", 5, payloads({"a", "b"})).ok);
    auto r = append_sync(s, "t", "p1", 5, payloads({"a", "b"}));
    EXPECT_TRUE(r.ok);
    EXPECT_TRUE(r.duplicate_batch);
    EXPECT_EQ(r.written, 0u);
    EXPECT_EQ(r.first_offset, 2u);
    EXPECT_TRUE(append_sync(s, "t", "p1", 3, payloads({"old"})).duplicate_batch);
    // Another producer, another topic, or no producer id: independent.
    EXPECT_FALSE(append_sync(s, "t", "p2", 5, payloads({"c"})).duplicate_batch);
    EXPECT_FALSE(append_sync(s, "u", "p1", 5, payloads({"d"})).duplicate_batch);
    EXPECT_EQ(append_sync(s, "t", "", 0, payloads({"e"})).written, 1u);
    EXPECT_EQ(append_sync(s, "t", "", 0, payloads({"e"})).written, 1u);
  }
  LogStore s(options(dir.path()));
  EXPECT_EQ(s.committed_offset("t"), 5u);
  auto r = append_sync(s, "t", "p1", 5, payloads({"a", "b"}));
  EXPECT_TRUE(r.duplicate_batch);
  EXPECT_EQ(r.first_offset, 5u);
  EXPECT_TRUE(append_sync(s, "t", "p2", 5, payloads({"c"})).duplicate_batch);
  r = append_sync(s, "t", "p1", 6, payloads({"f"}));
  EXPECT_FALSE(r.duplicate_batch);
  EXPECT_EQ(r.first_offset, 5u);
  EXPECT_EQ(texts(s.read("t", 0, 100, 1 << 20)), (std::vector<std::string>{"a", "b", "c", "e", "e", "f"}));
}

TEST(TopicLog, EventDedupeByKey) {
  TempDir dir;
  {
    LogStore s(options(dir.path()));
    // Within one batch.
    auto r = append_sync(s, "t", "", 0, keyed({"src\x1f" "1", "src\x1f" "2", "src\x1f" "1"}));
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.written, 2u);
    EXPECT_EQ(r.duplicates, 1u);
    // Across batches; the first written record gets the next offset.
    r = append_sync(s, "t", "", 0, keyed({"src\x1f" "2", "src\x1f" "3"}));
    EXPECT_EQ(r.written, 1u);
    EXPECT_EQ(r.duplicates, 1u);
    EXPECT_EQ(r.first_offset, 2u);
    // All duplicates: nothing written, first_offset is the next offset.
    r = append_sync(s, "t", "", 0, keyed({"src\x1f" "1"}));
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.written, 0u);
    EXPECT_EQ(r.first_offset, 3u);
    // Keys are per topic.
    EXPECT_EQ(append_sync(s, "other", "", 0, keyed({"src\x1f" "1"})).written, 1u);
  }
  LogStore s(options(dir.path()));
  auto r = append_sync(s, "t", "", 0, keyed({"src\x1f" "3", "src\x1f" "4"}));
  EXPECT_EQ(r.written, 1u);
  EXPECT_EQ(r.duplicates, 1u);
  EXPECT_EQ(r.first_offset, 3u);
  EXPECT_EQ(s.committed_offset("t"), 4u);
}

TEST(TopicLog, EventDedupeWindowEvictsOldestKeys) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.dedupe_window = 2;
  {
    LogStore s(o);
    EXPECT_EQ(append_sync(s, "t", "", 0, keyed({"a", "b", "c"})).written, 3u);  // "a" falls out
    auto r = append_sync(s, "t", "", 0, keyed({"c", "a"}));
    EXPECT_EQ(r.written, 1u);
    EXPECT_EQ(r.duplicates, 1u);
  }
  LogStore s(o);  // rebuilt from the tail: {"c", "a"}
  auto r = append_sync(s, "t", "", 0, keyed({"a", "c", "b"}));
  EXPECT_EQ(r.written, 1u);
  EXPECT_EQ(r.duplicates, 2u);
}

// The key table grows incrementally (the old table is drained a few slots per insert):
// every key stays found while it moves, erased keys stay gone, across many growths and
// with the window evicting as it fills.
TEST(TopicLog, EventDedupeHoldsWhileTheKeyTableGrows) {
  TempDir dir;
  LogOptions o = options(dir.path(), "never");
  o.dedupe_window = 5000;
  LogStore s(o);
  auto keys = [](int from, int to) {
    std::vector<std::string> k;
    for (int i = from; i < to; ++i) k.push_back("src\x1f" + std::to_string(i));
    return keyed(k);
  };
  constexpr int kBatch = 50, kTotal = 12000;
  for (int i = 0; i < kTotal; i += kBatch) {
    ASSERT_EQ(append_sync(s, "t", "", 0, keys(i, i + kBatch)).written, static_cast<std::size_t>(kBatch)) << i;
    if (i >= 4 * kBatch) {  // keys inserted a few batches ago, maybe still in the old table
      auto r = append_sync(s, "t", "", 0, keys(i - 4 * kBatch, i - 3 * kBatch));
      ASSERT_EQ(r.written, 0u) << i;
      ASSERT_EQ(r.duplicates, static_cast<std::size_t>(kBatch)) << i;
    }
  }
  // The last 5,000 are remembered, everything older is forgotten.
  auto r = append_sync(s, "t", "", 0, keys(kTotal - 5000, kTotal));
  EXPECT_EQ(r.written, 0u);
  EXPECT_EQ(r.duplicates, 5000u);
  r = append_sync(s, "t", "", 0, keys(kTotal - 5100, kTotal - 5000));
  EXPECT_EQ(r.written, 100u);
  EXPECT_EQ(s.committed_offset("t"), static_cast<std::uint64_t>(kTotal + 100));
}

// ---- segments and index ---------------------------------------------------------------

TEST(TopicLog, SegmentRollAndReadAcrossSegments) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.segment_bytes = 1000;
  const std::string producer = "p";
  {
    LogStore s(o);
    for (int b = 0; b < 10; ++b) {
      std::vector<AppendRecord> recs;
      for (int i = 0; i < 10; ++i) recs.push_back({"", numbered(b * 10 + i, 40)});
      ASSERT_TRUE(append_sync(s, "t", producer, static_cast<std::uint64_t>(b + 1), std::move(recs)).ok);
    }
    auto files = segment_files(dir.path(), "t");
    ASSERT_GT(files.size(), 5u);
    EXPECT_EQ(s.info("t")->segments, files.size());
    for (const auto& f : files) EXPECT_LE(fs::file_size(f), 1000u) << f;
    // Segment names are the base offsets, which are the offsets of their first records.
    const std::uint64_t per_segment = 1000 / on_disk(producer, "", numbered(0, 40));
    const std::string digits = std::to_string(per_segment);
    EXPECT_EQ(files[1].filename().string(), std::string(20 - digits.size(), '0') + digits + ".log");
  }
  LogStore s(o);
  EXPECT_EQ(s.committed_offset("t"), 100u);
  auto all = s.read("t", 0, 1000, 1 << 20);
  ASSERT_EQ(all.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(all[i].payload, numbered(i, 40));
  for (std::uint64_t from : {0u, 19u, 20u, 21u, 55u, 99u}) {
    auto part = s.read("t", from, 7, 1 << 20);
    ASSERT_FALSE(part.empty());
    EXPECT_EQ(part.front().offset, from);
    EXPECT_EQ(part.size(), std::min<std::size_t>(7, 100 - from));
  }
  auto r = append_sync(s, "t", producer, 11, payloads({numbered(100, 40)}));
  EXPECT_EQ(r.first_offset, 100u);
  EXPECT_TRUE(s.verify().empty());
}

TEST(TopicLog, SparseIndexReadsFromTheMiddleOfALargeSegment) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.index_interval_bytes = 512;
  constexpr int kRecords = 3000;
  auto payload = [](int i) { return numbered(i, 20 + (i * 37) % 90); };  // uneven sizes
  {
    LogStore s(o);
    for (int b = 0; b < kRecords / 500; ++b) {
      std::vector<AppendRecord> recs;
      for (int i = b * 500; i < (b + 1) * 500; ++i) recs.push_back({"", payload(i)});
      ASSERT_TRUE(append_sync(s, "big", "", 0, std::move(recs)).ok);
    }
    ASSERT_EQ(s.info("big")->segments, 1u);
    for (int from : {0, 1, 13, 1499, 1500, 2222, 2999}) {
      auto got = s.read("big", static_cast<std::uint64_t>(from), 3, 1 << 20);
      ASSERT_FALSE(got.empty()) << from;
      EXPECT_EQ(got.front().offset, static_cast<std::uint64_t>(from));
      EXPECT_EQ(got.front().payload, payload(from));
    }
  }
  // The index rebuilt by recovery serves the same reads.
  LogStore s(o);
  for (int from = 0; from < kRecords; from += 211) {
    auto got = s.read("big", static_cast<std::uint64_t>(from), 1, 1 << 20);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].offset, static_cast<std::uint64_t>(from));
    EXPECT_EQ(got[0].payload, payload(from));
  }
}

// ---- recovery -------------------------------------------------------------------------

TEST(TopicLog, RecoveryTruncatesTornTail) {
  TempDir dir;
  {
    LogStore s(options(dir.path(), "always"));
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(append_sync(s, "t", "p", static_cast<std::uint64_t>(i + 1), payloads({numbered(i)})).ok);
  }
  const fs::path seg = segment_files(dir.path(), "t").at(0);
  const auto size = fs::file_size(seg);
  fs::resize_file(seg, size - 5);  // a crash in the middle of writing the last record
  {
    LogStore s(options(dir.path(), "always"));
    EXPECT_EQ(fs::file_size(seg), size - on_disk("p", "", numbered(9)));
    EXPECT_EQ(s.committed_offset("t"), 9u);
    auto recs = s.read("t", 0, 100, 1 << 20);
    ASSERT_EQ(recs.size(), 9u);
    for (int i = 0; i < 9; ++i) EXPECT_EQ(recs[i].payload, numbered(i));
    // The lost batch (seq 10) is not a duplicate; appends continue at offset 9.
    auto r = append_sync(s, "t", "p", 10, payloads({"again"}));
    EXPECT_FALSE(r.duplicate_batch);
    EXPECT_EQ(r.first_offset, 9u);
    EXPECT_TRUE(s.verify().empty());
  }
  // A tail shorter than a record header is truncated too.
  {
    std::ofstream f(seg, std::ios::binary | std::ios::app);
    f.write("\x10\x00\x00", 3);
  }
  LogStore s(options(dir.path()));
  EXPECT_EQ(s.committed_offset("t"), 10u);
  EXPECT_EQ(s.read("t", 9, 10, 1 << 20).at(0).payload, "again");
  EXPECT_TRUE(s.verify().empty());
}

// A crash can keep only a prefix of the last batch. Its resend (same producer, same seq)
// must then store the lost events right after the kept ones, not be dropped as a
// duplicate (else they only arrive later through another copy, out of order).
TEST(TopicLog, ResendCompletesABatchCutShortByACrash) {
  TempDir dir;
  const auto first = keyed({"s\x1f" "a", "s\x1f" "b"});
  const auto second = keyed({"s\x1f" "c", "s\x1f" "d", "s\x1f" "e"});
  {
    LogStore s(options(dir.path(), "always"));
    ASSERT_TRUE(append_sync(s, "t", "p", 1, first).ok);
    ASSERT_TRUE(append_sync(s, "t", "p", 2, second).ok);
    ASSERT_TRUE(append_sync(s, "u", "p", 1, payloads({"x", "y"})).ok);
  }
  const fs::path seg = segment_files(dir.path(), "t").at(0);
  fs::resize_file(seg, fs::file_size(seg) - on_disk("p", second[2].dedupe_key, second[2].payload) + 3);  // e torn
  const fs::path useg = segment_files(dir.path(), "u").at(0);
  fs::resize_file(useg, fs::file_size(useg) - on_disk("p", "", "y"));
  {
    LogStore s(options(dir.path(), "always"));
    EXPECT_EQ(s.committed_offset("t"), 4u);
    EXPECT_TRUE(append_sync(s, "t", "p", 1, first).duplicate_batch);  // whole: still a duplicate
    auto r = append_sync(s, "t", "p", 2, second);
    EXPECT_TRUE(r.ok);
    EXPECT_FALSE(r.duplicate_batch);
    EXPECT_EQ(r.written, 1u);
    EXPECT_EQ(r.duplicates, 2u);
    EXPECT_EQ(r.first_offset, 4u);
    // Completed: a second resend is a duplicate batch again.
    r = append_sync(s, "t", "p", 2, second);
    EXPECT_TRUE(r.duplicate_batch);
    EXPECT_EQ(r.written, 0u);
    // Without de-dupe keys a resend cannot be completed safely: dropped as before.
    EXPECT_TRUE(append_sync(s, "u", "p", 1, payloads({"x", "y"})).duplicate_batch);
    EXPECT_EQ(s.committed_offset("u"), 1u);
    EXPECT_TRUE(s.verify().empty());
  }
  LogStore s(options(dir.path()));
  EXPECT_EQ(texts(s.read("t", 0, 100, 1 << 20)),
            (std::vector<std::string>{first[0].payload, first[1].payload, second[0].payload, second[1].payload,
                                      second[2].payload}));
  // After a restart the last batch is checked event by event again: nothing is doubled.
  auto r = append_sync(s, "t", "p", 2, second);
  EXPECT_EQ(r.written, 0u);
  EXPECT_EQ(r.duplicates, 3u);
  EXPECT_EQ(s.committed_offset("t"), 5u);
}

TEST(TopicLog, RecoveryNeverServesACorruptRecord) {
  TempDir dir;
  const std::string payload = numbered(0, 50);
  {
    LogStore s(options(dir.path()));
    std::vector<AppendRecord> recs;
    for (int i = 0; i < 10; ++i) recs.push_back({"k" + std::to_string(i), numbered(i, 50)});
    ASSERT_TRUE(append_sync(s, "t", "p", 1, std::move(recs)).ok);
  }
  const fs::path seg = segment_files(dir.path(), "t").at(0);
  const std::uint64_t rec = on_disk("p", "k0", payload);
  flip_byte(seg, 5 * rec + 45);  // inside record 5's payload
  LogStore s(options(dir.path()));
  EXPECT_EQ(s.committed_offset("t"), 5u);
  EXPECT_EQ(fs::file_size(seg), 5 * rec);
  auto recs = s.read("t", 0, 100, 1 << 20);
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs.back().offset, 4u);
  EXPECT_TRUE(s.read("t", 5, 100, 1 << 20).empty());
  EXPECT_TRUE(s.verify().empty());
  // Dedupe keys of the dropped records are forgotten with them.
  auto r = append_sync(s, "t", "p", 2, {{"k4", "dup"}, {"k5", "new"}});
  EXPECT_EQ(r.first_offset, 5u);
  EXPECT_EQ(r.written, 1u);
  EXPECT_EQ(r.duplicates, 1u);
}

TEST(TopicLog, RecoveryKeepsLaterSegmentsAndSkipsTheGap) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.segment_bytes = 600;
  const std::string p0 = numbered(0, 60);
  {
    LogStore s(o);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(append_sync(s, "t", "", 0, payloads({numbered(i, 60)})).ok);
  }
  auto files = segment_files(dir.path(), "t");
  ASSERT_GE(files.size(), 3u);
  const std::uint64_t rec = on_disk("", "", p0);
  const std::uint64_t per_segment = 600 / rec;
  flip_byte(files[0], 2 * rec + 30);  // record 2 of the first segment
  LogStore s(o);
  EXPECT_TRUE(s.verify().empty());
  EXPECT_EQ(fs::file_size(files[0]), 2 * rec);
  EXPECT_EQ(s.committed_offset("t"), 30u);
  auto recs = s.read("t", 0, 100, 1 << 20);
  ASSERT_EQ(recs.size(), 30u - (per_segment - 2));
  EXPECT_EQ(recs[1].offset, 1u);
  EXPECT_EQ(recs[2].offset, per_segment);
  EXPECT_EQ(recs[2].payload, numbered(static_cast<int>(per_segment), 60));
  // Reading from inside the gap starts at the next surviving record.
  auto gap = s.read("t", 3, 1, 1 << 20);
  ASSERT_EQ(gap.size(), 1u);
  EXPECT_EQ(gap[0].offset, per_segment);
  EXPECT_EQ(append_sync(s, "t", "", 0, payloads({"x"})).first_offset, 30u);
}

TEST(TopicLog, RecoveryOfAnEmptyTopicDirectory) {
  TempDir dir;
  fs::create_directories(dir.path() / "topics" / "empty");
  fs::create_directories(dir.path() / "topics" / ".not-a-topic");
  LogStore s(options(dir.path()));
  EXPECT_EQ(s.topics(), std::vector<std::string>{"empty"});
  EXPECT_EQ(s.committed_offset("empty"), 0u);
  EXPECT_EQ(append_sync(s, "empty", "", 0, payloads({"x"})).first_offset, 0u);
  EXPECT_EQ(s.read("empty", 0, 10, 100).size(), 1u);
}

TEST(TopicLog, WriteErrorFailsTheBatchAndKeepsTheTopicConsistent) {
  TempDir dir;
  LogStore s(options(dir.path(), "always"));
  ASSERT_TRUE(append_sync(s, "t", "p", 1, {{"k0", numbered(0, 100)}}).ok);
  const fs::path seg = segment_files(dir.path(), "t").at(0);
  const auto size = fs::file_size(seg);

  // A file size limit makes the next write stop part-way with EFBIG, like a full disk.
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit low = old;
  low.rlim_cur = size + 50;
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  auto r = append_sync(s, "t", "p", 2, {{"k1", numbered(1, 100)}, {"k2", numbered(2, 100)}});
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(fs::file_size(seg), size);  // the partial write was undone
  EXPECT_EQ(s.committed_offset("t"), 1u);
  EXPECT_EQ(s.read("t", 0, 10, 1 << 20).size(), 1u);
  // Neither the seq nor the keys of the failed batch were remembered: the retry is written.
  r = append_sync(s, "t", "p", 2, {{"k1", numbered(1, 100)}, {"k2", numbered(2, 100)}});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.first_offset, 1u);
  EXPECT_EQ(r.written, 2u);
  EXPECT_TRUE(s.verify().empty());
  EXPECT_EQ(texts(s.read("t", 0, 10, 1 << 20)),
            (std::vector<std::string>{numbered(0, 100), numbered(1, 100), numbered(2, 100)}));
}

// A batch that could not be written (the disk full for it) holds back the producer's later
// batches until it is sent again: had a smaller later batch been written meanwhile, the
// resend of the failed one would be taken for a duplicate (seq at or below the last
// written) and its events lost, or they would land after the later ones; nor may a stale
// later batch once the failed one is written (found by the chaos tests, tests/chaos/).
// Other producers are not held back.
TEST(TopicLog, AFailedBatchHoldsBackTheProducersLaterBatchesUntilItIsWritten) {
  TempDir dir;
  LogStore s(options(dir.path(), "always"));
  ASSERT_TRUE(append_sync(s, "t", "p", 1, {{"k0", numbered(0, 100)}}).ok);
  const auto size = fs::file_size(segment_files(dir.path(), "t").at(0));

  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit low = old;
  low.rlim_cur = size + 400;  // room for one small record, not for the big batch
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  const AppendResult big = append_sync(s, "t", "p", 2, {{"k1", numbered(1, 1000)}});
  const AppendResult later = append_sync(s, "t", "p", 3, {{"k2", numbered(2, 100)}});
  const AppendResult other = append_sync(s, "t", "q", 1, {{"k9", numbered(9, 100)}});
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_FALSE(big.ok);
  ASSERT_FALSE(later.ok) << "a later batch was written while an earlier one of its producer was not";
  EXPECT_STREQ(later.code, "storage_error");
  EXPECT_NE(later.error.find("comes after its batch 2"), std::string::npos) << later.error;
  EXPECT_TRUE(other.ok) << other.error;  // another producer is not held back
  // The producer sends again from the failed batch: it is written. A stale batch of the
  // dead connection (seq 4, queued behind) must not slip in before batch 3, which was
  // refused too: it is refused until 3 is written. Then 3 and 4 go in, in order.
  const AppendResult again = append_sync(s, "t", "p", 2, {{"k1", numbered(1, 1000)}});
  ASSERT_TRUE(again.ok) << again.error;
  EXPECT_FALSE(again.duplicate_batch);
  EXPECT_EQ(again.written, 1u);
  const AppendResult stale = append_sync(s, "t", "p", 4, {{"k3", numbered(3, 100)}});
  EXPECT_FALSE(stale.ok);
  EXPECT_NE(stale.error.find("comes after its batch 3"), std::string::npos) << stale.error;
  ASSERT_TRUE(append_sync(s, "t", "p", 3, {{"k2", numbered(2, 100)}}).ok);
  ASSERT_TRUE(append_sync(s, "t", "p", 4, {{"k3", numbered(3, 100)}}).ok);
  EXPECT_EQ(texts(s.read("t", 0, 10, 1 << 20)), (std::vector<std::string>{numbered(0, 100), numbered(9, 100),
                                                                          numbered(1, 1000), numbered(2, 100),
                                                                          numbered(3, 100)}));
  EXPECT_TRUE(s.verify().empty());
}

// fsync always: a failed fdatasync fails the batches it covered, and the topic takes no
// more writes (the page cache may hold what the disk lost) while other topics go on. After
// a restart the topic is writable again; a resend of the failed batch is stored at most once.
TEST(TopicLog, FailedSyncStopsTheTopicUntilRestart) {
  TempDir dir;
  std::atomic<int> fail_next{0};
  LogOptions o = options(dir.path(), "always");
  o.segment_sync = [&](int fd) {
    if (fail_next.exchange(0)) {
      errno = EIO;
      return -1;
    }
    return ::fdatasync(fd);
  };
  const auto one = [](const char* id) { return keyed({std::string("s\x1f") + id}); };
  {
    LogStore s(o);
    ASSERT_TRUE(append_sync(s, "t", "p", 1, one("1")).ok);
    ASSERT_TRUE(append_sync(s, "u", "p", 1, one("1")).ok);
    fail_next = 1;
    auto r = append_sync(s, "t", "p", 2, one("2"));
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("cannot sync"), std::string::npos) << r.error;
    EXPECT_EQ(s.committed_offset("t"), 1u);  // never visible to readers
    r = append_sync(s, "t", "p", 3, one("3"));
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("until the relay restarts"), std::string::npos) << r.error;
    EXPECT_TRUE(append_sync(s, "u", "p", 2, one("2")).ok);  // other topics go on
    EXPECT_EQ(s.committed_offset("u"), 2u);
  }
  o.segment_sync = nullptr;
  LogStore s(o);
  auto r = append_sync(s, "t", "p", 2, one("2"));
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(s.committed_offset("t"), 2u);
  EXPECT_TRUE(append_sync(s, "t", "p", 3, one("3")).ok);
  const auto got = texts(s.read("t", 0, 10, 1 << 20));
  EXPECT_EQ(got, (std::vector<std::string>{one("1")[0].payload, one("2")[0].payload, one("3")[0].payload}));
  EXPECT_TRUE(s.verify().empty());
}

// A group whose own fdatasync stalls is acked once a later sync of the same file returns:
// that sync covered its data. Syncs are held in the fault-injection hook: the first one
// blocks until the end, the second is let through, and both batches must complete while
// the first is still blocked.
TEST(TopicLog, ALaterSyncVouchesForAnEarlierGroupWhoseSyncStalls) {
  TempDir dir;
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  bool release_first = false;
  LogOptions o = options(dir.path(), "always");
  o.segment_sync = [&](int fd) {
    std::unique_lock lk(mu);
    const int me = ++entered;
    cv.notify_all();
    if (me == 1) cv.wait(lk, [&] { return release_first; });
    lk.unlock();
    return ::fdatasync(fd);
  };
  {
    LogStore s(o);
    std::promise<AppendResult> a, b;
    s.append("t", "p", 1, payloads({"a"}), [&a](const AppendResult& r) { a.set_value(r); });
    {
      std::unique_lock lk(mu);
      ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return entered >= 1; }));
    }
    s.append("t", "p", 2, payloads({"b"}), [&b](const AppendResult& r) { b.set_value(r); });
    auto fa = a.get_future(), fb = b.get_future();
    const bool both = fb.wait_for(std::chrono::seconds(10)) == std::future_status::ready &&
                      fa.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    {
      std::lock_guard lk(mu);
      EXPECT_FALSE(release_first);  // still blocked: the second sync vouched for "a"
      release_first = true;
      cv.notify_all();
    }
    ASSERT_TRUE(both) << "the batches waited for the stalled sync";
    EXPECT_TRUE(fa.get().ok);
    EXPECT_TRUE(fb.get().ok);
    EXPECT_EQ(s.committed_offset("t"), 2u);
  }
  LogStore s(o);
  EXPECT_EQ(texts(s.read("t", 0, 10, 1 << 20)), (std::vector<std::string>{"a", "b"}));
}

// With fsync always each syncer has its own descriptor of the segment being written; a
// segment the topic has rolled past keeps only its reading descriptor, so a long retained
// log does not hold four descriptors per segment. Also after a restart.
TEST(TopicLog, RolledSegmentsKeepOneDescriptorEach) {
  TempDir dir;
  LogOptions o = options(dir.path(), "always");
  o.segment_bytes = 1000;
  auto open_fds = [] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const std::size_t before = open_fds();
  auto write_some = [&](LogStore& s, int first) {
    for (int b = first; b < first + 40; ++b)
      ASSERT_TRUE(append_sync(s, "t", "p", static_cast<std::uint64_t>(b + 1), payloads({numbered(b, 200)})).ok);
  };
  {
    LogStore s(o);
    write_some(s, 0);
    const std::size_t segments = segment_files(dir.path(), "t").size();
    ASSERT_GT(segments, 8u);
    const std::size_t held = open_fds() - before;
    EXPECT_GE(held, segments);
    EXPECT_LE(held, segments + 3 + 4) << "segments " << segments;  // + the active one's syncers, lock, dirs
  }
  LogStore s(o);
  write_some(s, 40);
  const std::size_t segments = segment_files(dir.path(), "t").size();
  EXPECT_LE(open_fds() - before, segments + 3 + 4) << "segments " << segments;
  EXPECT_TRUE(s.verify().empty());
  EXPECT_EQ(s.committed_offset("t"), 80u);
}

// ---- retention ------------------------------------------------------------------------

TEST(TopicLog, RetentionByBytes) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.segment_bytes = 500;
  o.retention_bytes = 1500;
  LogStore s(o);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(append_sync(s, "t", "", 0, payloads({numbered(i, 60)})).ok);
  s.enforce_retention();
  auto info = s.info("t");
  ASSERT_TRUE(info);
  EXPECT_LE(info->bytes, 1500u);
  EXPECT_GT(info->first_offset, 0u);
  EXPECT_EQ(info->next_offset, 60u);
  EXPECT_EQ(segment_files(dir.path(), "t").size(), info->segments);
  auto recs = s.read("t", 0, 1000, 1 << 20);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front().offset, info->first_offset);
  EXPECT_EQ(recs.back().offset, 59u);
  EXPECT_EQ(s.first_offset("t"), info->first_offset);
  EXPECT_TRUE(s.verify().empty());
}

TEST(TopicLog, RetentionByAge) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.segment_bytes = 500;
  o.retention_age = std::chrono::seconds(1);
  LogStore s(o);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(append_sync(s, "t", "", 0, payloads({numbered(i, 60)})).ok);
  const auto segments = s.info("t")->segments;
  ASSERT_GT(segments, 2u);
  s.enforce_retention();  // nothing is old yet
  EXPECT_EQ(s.info("t")->segments, segments);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  s.enforce_retention();
  auto info = s.info("t");
  EXPECT_EQ(info->segments, 1u);  // the active segment always stays
  EXPECT_EQ(segment_files(dir.path(), "t").size(), 1u);
  EXPECT_EQ(info->next_offset, 30u);
  auto recs = s.read("t", 0, 100, 1 << 20);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front().offset, info->first_offset);
  EXPECT_EQ(recs.back().offset, 29u);
}

TEST(TopicLog, RetentionByTopicKeepsDataTopicsApartFromTheEventsHistory) {
  // The data topic is bounded by bytes, the events topic by nothing (the default), a
  // topic that matches no rule by the default: only the data topic loses records.
  TempDir dir;
  LogOptions o = options(dir.path());
  o.segment_bytes = 500;
  o.retention_by_topic = {{"*.data", Retention{1500, std::chrono::seconds(0)}}, {"wf.ev*", Retention{}}};
  LogStore s(o);
  for (const char* t : {"wf.data", "wf.events", "other"})
    for (int i = 0; i < 60; ++i) ASSERT_TRUE(append_sync(s, t, "", 0, payloads({numbered(i, 60)})).ok);
  s.enforce_retention();
  const auto data = s.info("wf.data"), events = s.info("wf.events"), other = s.info("other");
  EXPECT_LE(data->bytes, 1500u);
  EXPECT_GT(data->first_offset, 0u);
  EXPECT_EQ(data->retention_bytes, 1500u);
  EXPECT_EQ(events->first_offset, 0u);
  EXPECT_EQ(events->retention_bytes, 0u);
  EXPECT_EQ(other->first_offset, 0u);
  EXPECT_EQ(retention_of("wf.data", o.retention_by_topic, Retention{7, std::chrono::seconds(9)}).bytes, 1500u);
  EXPECT_EQ(retention_of("x", o.retention_by_topic, Retention{7, std::chrono::seconds(9)}).age.count(), 9);
  EXPECT_FALSE(any_bounded({{"a", Retention{}}}, Retention{}));
  EXPECT_TRUE(any_bounded({{"a", Retention{0, std::chrono::seconds(1)}}}, Retention{}));
}

// ---- consumer groups ------------------------------------------------------------------

TEST(TopicLog, GroupOffsetsPersistAndCorruptFilesAreIgnored) {
  TempDir dir;
  {
    LogStore s(options(dir.path()));
    EXPECT_FALSE(s.group_offset("g1", "t"));
    s.commit_group_offset("g1", "t", 42);
    s.commit_group_offset("g1", "u", 7);
    s.commit_group_offset("g2", "t", 1);
    s.commit_group_offset("g1", "t", 43);
    EXPECT_EQ(s.group_offset("g1", "t"), 43u);
    EXPECT_THROW(s.commit_group_offset("../x", "t", 1), diaspora::Error);
    EXPECT_THROW(s.commit_group_offset("g", "a/b", 1), diaspora::Error);
  }
  const fs::path groups = dir.path() / "groups";
  EXPECT_FALSE(fs::exists(groups / "g1.json.tmp"));
  {
    std::ofstream(groups / "broken.json") << "{\"offsets\": {\"t\": ";
    std::ofstream(groups / "negative.json") << "{\"offsets\": {\"t\": -1}}";
    std::ofstream(groups / "array.json") << "[1,2,3]";
    std::ofstream(groups / "g2.json.tmp") << "garbage";
  }
  LogStore s(options(dir.path()));
  EXPECT_EQ(s.group_offset("g1", "t"), 43u);
  EXPECT_EQ(s.group_offset("g1", "u"), 7u);
  EXPECT_EQ(s.group_offset("g2", "t"), 1u);
  EXPECT_FALSE(s.group_offset("broken", "t"));
  EXPECT_FALSE(s.group_offset("negative", "t"));
  auto all = s.group_offsets();
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::tuple<std::string, std::string, std::uint64_t>>{
                     {"g1", "t", 43}, {"g1", "u", 7}, {"g2", "t", 1}}));
  // A corrupt group can be committed afresh.
  s.commit_group_offset("broken", "t", 5);
  EXPECT_EQ(s.group_offset("broken", "t"), 5u);
}

TEST(TopicLog, GroupsAreBoundedInNumber) {
  TempDir dir;
  auto o = options(dir.path());
  o.max_groups = 2;
  LogStore s(o);
  s.commit_group_offset("a", "t", 1);
  s.commit_group_offset("b", "t", 2);
  EXPECT_THROW(s.commit_group_offset("c", "t", 3), diaspora::relay::GroupLimitError);
  EXPECT_FALSE(s.group_offset("c", "t"));
  EXPECT_FALSE(fs::exists(dir.path() / "groups" / "c.json"));
  s.commit_group_offset("a", "u", 4);  // existing groups still commit, on any topic
  EXPECT_EQ(s.group_offset("a", "u"), 4u);
}

TEST(TopicLog, TopicsAreBoundedInNumberAlsoAfterARestart) {
  TempDir dir;
  auto o = options(dir.path());
  o.max_topics = 2;
  {
    LogStore s(o);
    EXPECT_TRUE(append_sync(s, "a", "p", 1, payloads({"1"})).ok);
    EXPECT_TRUE(append_sync(s, "b", "p", 1, payloads({"2"})).ok);
    AppendResult r = append_sync(s, "c", "p", 1, payloads({"3"}));
    EXPECT_FALSE(r.ok);
    EXPECT_STREQ(r.code, "too_many_topics");
    EXPECT_NE(r.error.find("max_topics"), std::string::npos) << r.error;
    EXPECT_FALSE(fs::exists(dir.path() / "topics" / "c"));
    EXPECT_TRUE(append_sync(s, "a", "p", 2, payloads({"4"})).ok);  // existing topics take writes
  }
  LogStore s(o);  // the recovered topics count
  EXPECT_STREQ(append_sync(s, "c", "p", 1, payloads({"3"})).code, "too_many_topics");
  EXPECT_EQ(texts(s.read("a", 0, 10, 1 << 20)), (std::vector<std::string>{"1", "4"}));
}

TEST(TopicLog, OneStorePerDirectory) {
  TempDir dir;
  LogStore s(options(dir.path()));
  EXPECT_THROW(LogStore second(options(dir.path())), diaspora::Error);
}

TEST(TopicLog, DestructorDrainsQueuedAppends) {
  TempDir dir;
  std::atomic<int> done{0};
  {
    LogStore s(options(dir.path(), "interval:1000"));
    for (int i = 0; i < 50; ++i)
      s.append("t", "", 0, payloads({numbered(i)}), [&](const AppendResult& r) { done += r.ok ? 1 : 0; });
  }
  EXPECT_EQ(done.load(), 50);
  LogStore s(options(dir.path()));
  EXPECT_EQ(s.committed_offset("t"), 50u);
}

TEST(TopicLog, OffsetAtTimeOverSegments) {
  TempDir dir;
  LogOptions o = options(dir.path());
  o.segment_bytes = 600;  // a few records a segment: the search crosses segments
  LogStore s(o);
  EXPECT_EQ(s.offset_at_time("t", 0), 0u);  // no topic: its (empty) end
  for (int b = 0; b < 8; ++b) {
    std::vector<std::string> texts;
    for (int i = 0; i < 5; ++i) texts.push_back("{\"batch\":" + std::to_string(b) + ",\"i\":" + std::to_string(i) + "}");
    ASSERT_TRUE(append_sync(s, "t", "p", static_cast<std::uint64_t>(b + 1), payloads(texts)).ok);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  ASSERT_GT(s.info("t")->segments, 2u);
  const auto recs = s.read("t", 0, 100, 1 << 20);
  ASSERT_EQ(recs.size(), 40u);
  for (const auto& r : recs) {
    std::uint64_t first = 0;  // the first offset appended at or after r's time
    while (recs[first].time_us < r.time_us) ++first;
    EXPECT_EQ(s.offset_at_time("t", r.time_us), first) << "offset " << r.offset;
    EXPECT_EQ(s.offset_at_time("t", r.time_us + 1), [&] {
      std::uint64_t k = first;
      while (k < recs.size() && recs[k].time_us <= r.time_us) ++k;
      return k;
    }());
  }
  EXPECT_EQ(s.offset_at_time("t", 0), 0u);
  EXPECT_EQ(s.offset_at_time("t", recs.back().time_us + 1), 40u);  // after everything: the end
}
