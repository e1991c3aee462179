// Browsing a topic (relay/src/topic_browse.*): forward and backward scans across the read
// chunks (512 records) and the byte bound (8 MiB a read), the scan bound, filters, and the
// query parser's refusals. The HTTP side is in tests/python/test_topic_browse.py.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <future>
#include <string>
#include <vector>

#include "test_helpers.hpp"
#include "topic_browse.hpp"
#include "topic_log.hpp"

namespace diaspora::relay {
namespace {

using diaspora::test::TempDir;

// `n` events e-0.. on topic "t" (data padded to `pad` bytes), in batches of 100.
void fill(LogStore& s, int n, std::size_t pad = 0) {
  for (int lo = 0; lo < n; lo += 100) {
    std::vector<AppendRecord> recs;
    for (int i = lo; i < std::min(n, lo + 100); ++i)
      recs.push_back({"", "{\"specversion\":\"1.0\",\"id\":\"e-" + std::to_string(i) +
                              "\",\"source\":\"/s\",\"type\":\"" + (i % 10 == 3 ? "org.x.Alarm" : "org.x.tick") +
                              "\",\"data\":{\"pad\":\"" + std::string(pad, 'p') + "\"}}"});
    std::promise<void> done;
    s.append("t", "", 0, std::move(recs), [&](const AppendResult& r) {
      EXPECT_TRUE(r.ok) << r.error;
      done.set_value();
    });
    done.get_future().wait();
  }
}

LogOptions opts(const TempDir& d) {
  LogOptions o;
  o.data_dir = d.path();
  o.fsync = FsyncPolicy::parse("never");
  return o;
}

std::vector<std::uint64_t> offsets(const BrowseResult& r) {
  std::vector<std::uint64_t> out;
  for (const auto& e : r.events) out.push_back(e.offset);
  return out;
}

std::vector<std::uint64_t> range(std::uint64_t from, std::uint64_t to, int step = 1) {  // [from, to)
  std::vector<std::uint64_t> out;
  for (auto i = static_cast<std::int64_t>(from); step > 0 ? i < static_cast<std::int64_t>(to) : i > static_cast<std::int64_t>(to); i += step)
    out.push_back(static_cast<std::uint64_t>(i));
  return out;
}

TEST(TopicBrowse, PagesBackwardAcrossReadChunksWithoutSkippingOrRepeating) {
  TempDir d;
  LogStore s(opts(d));
  fill(s, 1500);
  BrowseRequest rq = parse_browse({{"limit", "700"}});  // newest first, more than a chunk
  auto a = browse(s, "t", rq);
  EXPECT_EQ(offsets(a), range(1499, 799, -1));
  ASSERT_TRUE(a.next);
  rq = parse_browse({{"from", std::to_string(*a.next)}, {"direction", "backward"}, {"limit", "10000"}});
  auto b = browse(s, "t", rq);
  EXPECT_EQ(offsets(b), range(799, -1, -1));
  EXPECT_TRUE(b.reached_end);
  EXPECT_FALSE(b.next);
}

TEST(TopicBrowse, TheByteBoundOfAReadDoesNotSkipTheNewestEventsBackward) {
  TempDir d;
  LogStore s(opts(d));
  fill(s, 300, 100000);  // 300 events of 100 KB: a read of 512 stops at 8 MiB (about 80)
  auto r = browse(s, "t", parse_browse({{"limit", "300"}}));
  EXPECT_EQ(offsets(r), range(299, -1, -1));
  auto f = browse(s, "t", parse_browse({{"from", "0"}, {"limit", "300"}}));
  EXPECT_EQ(offsets(f), range(0, 300));
}

TEST(TopicBrowse, FiltersAndTheScanBound) {
  TempDir d;
  LogStore s(opts(d));
  fill(s, 1000);
  auto alarms = browse(s, "t", parse_browse({{"from", "0"}, {"type", "ALARM"}, {"limit", "5"}}));
  EXPECT_EQ(offsets(alarms), (std::vector<std::uint64_t>{3, 13, 23, 33, 43}));
  EXPECT_EQ(alarms.next, 44u);  // after the last looked at
  auto bounded = browse(s, "t", parse_browse({{"from", "100"}, {"id", "e-999"}, {"max_scan", "600"}}));
  EXPECT_TRUE(bounded.events.empty());
  EXPECT_TRUE(bounded.limited_by_scan);
  EXPECT_EQ(bounded.scanned_low, 100u);
  EXPECT_EQ(bounded.scanned_high, 699u);
  EXPECT_EQ(bounded.next, 700u);
  auto found = browse(s, "t", parse_browse({{"id", "e-17"}}));  // backward from the end
  EXPECT_EQ(offsets(found), (std::vector<std::uint64_t>{17}));
  EXPECT_EQ(found.records, 1000u);
  EXPECT_TRUE(browse(s, "nothing", parse_browse({})).events.empty());
}

TEST(TopicBrowse, RefusesParametersItCannotUseNamingThem) {
  auto says = [](std::map<std::string, std::string> q) {
    try {
      (void)parse_browse(q);
    } catch (const BrowseError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(says({{"limit", "10001"}}).find("'limit'"), std::string::npos);
  EXPECT_NE(says({{"max_scan", "-1"}}).find("'max_scan'"), std::string::npos);
  EXPECT_NE(says({{"from", "18446744073709551615"}}).find("'from'"), std::string::npos);
  EXPECT_NE(says({{"from_time", "2026-13-01T00:00:00Z"}}).find("'from_time'"), std::string::npos);
  EXPECT_NE(says({{"sort", "x"}}).find("unknown parameter 'sort'"), std::string::npos);
  EXPECT_EQ(says({{"from", "earliest"}, {"q", "x"}, {"format", "csv"}}), "accepted");
}

}  // namespace
}  // namespace diaspora::relay
