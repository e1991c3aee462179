// Fuzz target: the engine plugin's spool recovery (plugin/src/spool.hpp) on arbitrary bytes:
// its cursor file and two segment files, as a crash, a full disk or a bad disk may leave
// them. The first byte steers: odd, the segments are records framed from the input's parts
// (then damaged where the input says: a byte flipped, the tail cut); even, the parts are
// the files' bytes. Invariants: opening never throws for damaged contents; what recovery
// keeps reads back, as many records as records() said, none empty; after a commit of all of
// them the spool is empty, and a record appended then reads back.
#include <span>

#include "diaspora/files.hpp"
#include "diaspora/records.hpp"
#include "fuzz_support.hpp"
#include "spool.hpp"

using namespace diaspora;
namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const std::uint8_t how = in.byte();
  const std::uint8_t number2 = in.byte();
  const std::uint16_t damage_at = static_cast<std::uint16_t>(in.byte() << 8 | in.byte());
  const std::string_view cursor = in.part();
  std::string seg1, seg2;
  if (how & 1) {
    plugin::SpoolRecords first, second;
    for (std::string_view p : in.parts()) {
      plugin::SpoolRecords& into = first.count() < 6 ? first : second;
      into.begin() += p;
      into.end();
    }
    seg1 = std::string(first.bytes());
    seg2 = std::string(second.bytes());
    fuzz::damage((how & 2) ? seg2 : seg1, how & 4, damage_at, static_cast<std::uint8_t>(damage_at >> 3));
  } else {
    seg1 = std::string(in.part());
    seg2 = std::string(in.rest());
  }
  const fs::path dir = fuzz::scratch_dir() / "spool";
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_file_atomic(dir / storage::segment_name(1, ".spool"), seg1);
  if (how & 8) write_file_atomic(dir / storage::segment_name(1 + number2 % 4, ".spool"), seg2);
  if (how & 16) write_file_atomic(dir / "cursor", cursor);

  plugin::SpoolOptions so;
  so.dir = dir;
  so.segment_bytes = 4096;
  so.log = [](const std::string&) {};
  plugin::Spool spool(so);
  const std::uint64_t kept = spool.records();
  std::uint64_t read = 0;
  plugin::SpoolPosition end;
  for (std::size_t n; (n = spool.read([&](std::string_view r) { FUZZ_CHECK(!r.empty()); }, 64, 1 << 20, end)) > 0;)
    read += n;
  FUZZ_CHECK(read == kept);
  FUZZ_CHECK(!spool.has_unread());
  if (read) spool.commit(end);
  FUZZ_CHECK(spool.records() == 0 && spool.bytes() == 0);
  const std::string_view after[] = {"after recovery"};
  FUZZ_CHECK(spool.append(std::span<const std::string_view>(after)) == 1);
  std::vector<std::string> out;
  FUZZ_CHECK(spool.read(out, 8, 1 << 20, end) == 1 && out[0] == "after recovery");
  return 0;
}
