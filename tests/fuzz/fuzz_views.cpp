// Fuzz target: the relay's views (relay/src/views.hpp) from what they read off disk and the
// log: the snapshot file (a damaged, foreign or hostile snapshot.json), the records of a
// workflow's events topic (any bytes: the views must survive a record they cannot use), and
// the query parameters of GET /api/v1/views/. Input: a steering byte, then
// "SNAPSHOT\n--\nQUERY\n--\nRECORD\n--\nRECORD...". Invariants: building and querying never
// throws but the documented ViewQueryError; every answer holds a total and items; a snapshot
// the views write is one they load back as it was.
#include <boost/json.hpp>

#include <future>

#include "diaspora/files.hpp"
#include "fuzz_support.hpp"
#include "http_api.hpp"
#include "topic_log.hpp"
#include "views.hpp"

using namespace diaspora;
namespace fs = std::filesystem;
namespace json = boost::json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const std::uint8_t how = in.byte();
  const std::string_view snapshot = in.part();
  const relay::Target query = relay::parse_target("/?" + std::string(in.part()));
  std::vector<relay::AppendRecord> records;
  for (std::string_view p : in.parts())
    if (!p.empty()) records.push_back({"", std::string(p)});

  const fs::path dir = fuzz::scratch_dir() / "views";
  fs::remove_all(dir);
  relay::LogOptions lo;
  lo.data_dir = dir / "log";
  lo.fsync = relay::FsyncPolicy::parse("never");
  relay::LogStore store(lo);
  if (!records.empty()) {
    std::promise<void> done;
    store.append((how & 1) ? "wf.control.engine-1" : "wf.events", "", 0, std::move(records),
                 [&](const relay::AppendResult&) { done.set_value(); });
    done.get_future().wait();
  }
  fs::create_directories(dir / "views");
  if (how & 2) write_file_atomic(dir / "views" / "snapshot.json", snapshot);
  json::object first;
  {
    relay::Views views(store, {.dir = dir / "views"});
    views.catch_up();
    const bool everything = (how & 4) == 0;
    for (const char* view : {"workflows", "tasks", "sites", "resources", "actions", "consumers"}) {
      try {
        const json::object page =
            views.query(view, query.query, [&](const std::string& wf) { return everything || wf == "wf"; });
        FUZZ_CHECK(page.contains("items") && page.contains("total"));
      } catch (const relay::ViewQueryError&) {
      }
    }
    first = views.query("tasks", {}, [](const std::string&) { return true; });
    views.write_snapshot();
  }
  relay::Views again(store, {.dir = dir / "views"});
  FUZZ_CHECK(again.snapshot_note().starts_with("snapshot loaded"));
  again.catch_up();
  json::object second = again.query("tasks", {}, [](const std::string&) { return true; });
  first.erase("version");
  second.erase("version");
  if (first != second && std::getenv("DIASPORA_FUZZ_DEBUG"))
    std::fprintf(stderr, "before: %s\nafter:  %s\n", json::serialize(first).c_str(), json::serialize(second).c_str());
  FUZZ_CHECK(first == second);
  return 0;
}
