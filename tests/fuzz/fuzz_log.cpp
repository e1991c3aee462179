// Fuzz target: the relay log's recovery on arbitrary bytes (a segment torn or damaged in any
// way, a second segment after it, a consumer group's file), as LogStore finds them when it
// opens a data directory after a crash or a bad disk. The first byte steers: odd, the
// segments are records encoded from the input's parts (then damaged at a place the input
// names: a byte flipped, the tail cut); even, the segments are the input's parts as bytes.
// Invariants: opening never throws for damaged contents; after recovery verify() finds
// nothing; reads give strictly increasing offsets; an append after recovery gets the next
// offset and reads back.
#include <future>

#include "diaspora/files.hpp"
#include "diaspora/records.hpp"
#include "fuzz_support.hpp"
#include "log_record.hpp"
#include "topic_log.hpp"

using namespace diaspora;
namespace fs = std::filesystem;

namespace {

// The records of `payloads` from offset `base`, as the writer frames them.
std::string encode(std::uint64_t base, const std::vector<std::string_view>& payloads) {
  relay::WriteBuffer out;
  for (std::size_t i = 0; i < payloads.size(); ++i)
    relay::encode_record(out, base + i, 1'700'000'000'000'000 + static_cast<std::int64_t>(i), i + 1,
                         i % 2 ? "producer-a" : "", i % 3 ? "src\x1fid" + std::to_string(i) : "", payloads[i]);
  return std::string(out.data(), out.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const std::uint8_t how = in.byte();
  const std::uint8_t second_base = in.byte();
  const std::uint16_t damage_at = static_cast<std::uint16_t>(in.byte() << 8 | in.byte());
  const std::uint8_t flip = in.byte();
  const std::string_view group = in.part();
  std::string seg1, seg2;
  std::uint64_t base2 = second_base;
  if (how & 1) {
    std::vector<std::string_view> first, second;
    for (std::string_view p : in.parts()) (first.size() < 8 ? first : second).push_back(p);
    base2 = first.size() + (second_base % 4) - 1;  // right after the first, or one before or past it
    seg1 = encode(0, first);
    seg2 = encode(base2, second);
    fuzz::damage((how & 2) ? seg2 : seg1, how & 4, damage_at, flip);
  } else {
    seg1 = std::string(in.part());
    seg2 = std::string(in.rest());
  }

  const fs::path dir = fuzz::scratch_dir() / "log";
  fs::remove_all(dir);
  fs::create_directories(dir / "topics" / "t");
  fs::create_directories(dir / "groups");
  write_file_atomic(dir / "topics" / "t" / storage::segment_name(0, ".log"), seg1);
  if ((how & 8) && base2 > 0) write_file_atomic(dir / "topics" / "t" / storage::segment_name(base2, ".log"), seg2);
  write_file_atomic(dir / "groups" / "g.json", group);

  relay::LogOptions lo;
  lo.data_dir = dir;
  lo.fsync = relay::FsyncPolicy::parse("never");
  relay::LogStore store(lo);
  FUZZ_CHECK(store.verify().empty());
  std::uint64_t last = 0;
  bool any = false;
  store.visit("t", 0, SIZE_MAX, SIZE_MAX, [&](const relay::LogStore::RecordRef& r) {
    FUZZ_CHECK(!any || r.offset > last);
    any = true;
    last = r.offset;
  });
  (void)store.group_offset("g", "t");
  const std::uint64_t next = store.committed_offset("t");
  std::promise<relay::AppendResult> done;
  store.append("t", "producer-b", 1, {relay::AppendRecord{"", "{\"after\":\"recovery\"}"}},
               [&](const relay::AppendResult& r) { done.set_value(r); });
  const relay::AppendResult r = done.get_future().get();
  FUZZ_CHECK(r.ok && r.written == 1 && r.first_offset == next);
  const auto back = store.read("t", next, 1, 1 << 20);
  FUZZ_CHECK(back.size() == 1 && back[0].offset == next && back[0].payload == "{\"after\":\"recovery\"}");
  return 0;
}
