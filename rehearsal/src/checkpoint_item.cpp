#include "checkpoint_item.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include "diaspora/data_item.hpp"
#include "diaspora/event.hpp"  // make_uuid, format_rfc3339_us
#include "diaspora/files.hpp"
#include "diaspora/items.hpp"
#include "diaspora/payloads.hpp"
#include "diaspora/rehearsal.hpp"
#include "fabric.hpp"

namespace diaspora::rehearsal {

namespace json = boost::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The item's content_type; its data.seq is the checkpoint's step, data.files its files.
constexpr std::string_view kContentType = "application/vnd.diaspora.checkpoint";

// A name a checkpoint folder may hold: a plain file name (no folder, not . or ..; the event's
// schema, checked by from_json, already bounds the list, the sizes and refuses a '/').
bool plain_name(std::string_view n) {
  return !n.empty() && n.size() <= 255 && n != "." && n != ".." && n.find('/') == std::string_view::npos &&
         n.find('\0') == std::string_view::npos;
}

RelayClientOptions relay_of(const TrainerConfig& c, const std::string& client_id) {
  if (c.checkpoint_relay.empty() || c.checkpoint_ca_file.empty() || c.checkpoint_token_file.empty())
    throw RehearsalError("checkpoint items need checkpoint.relay, checkpoint.ca_file and checkpoint.token_file "
                         "(docs/rehearsal.md, \"Checkpoints as data items\")");
  return detail::fabric_options(c.checkpoint_relay, c.checkpoint_ca_file, c.checkpoint_token_file, client_id);
}

// Calls `attempt` until it returns, retrying a RelayClientError every second for
// `patience_s`; then throws RehearsalError with `what` and the last error.
template <class F>
auto with_patience(double patience_s, const std::string& what, F&& attempt) {
  const auto until = Clock::now() + std::chrono::duration<double>(patience_s);
  for (;;) {
    try {
      return attempt();
    } catch (const RelayClientError& e) {
      if (Clock::now() >= until)
        throw RehearsalError(what + ": the relay stayed away for " + std::to_string(static_cast<long>(patience_s)) +
                             " s (last error: " + e.what() + ")");
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

}  // namespace

namespace detail {

CheckpointShipper::CheckpointShipper(const TrainerConfig& cfg)
    : cfg_(cfg), producer_("diaspora-train-" + make_uuid()) {}

CheckpointShipper::~CheckpointShipper() = default;

std::string CheckpointShipper::ship(const fs::path& dir, std::int64_t step, double patience_s) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string bytes;
  events::DataItem d;
  d.stream = cfg_.plugin_task_id;
  d.seq = step;
  d.content_type = std::string(kContentType);
  d.site = cfg_.plugin_site.empty() ? std::nullopt : std::optional(cfg_.plugin_site);
  d.files.emplace();
  for (const fs::path& f : files) {
    const std::string b = read_file(f);
    d.files->push_back({f.filename().string(), static_cast<std::int64_t>(b.size())});
    bytes += b;
  }
  const std::string what = "checkpoint " + dir.string() + " as a data item on " + cfg_.checkpoint_item_topic;
  const json::object event = event_to_json(events::make_event("/diaspora/train", d));
  const std::uint64_t seq = ++seq_;  // resent with this seq: the relay keeps one
  const items::PutResult r = with_patience(patience_s, what, [&] {
    try {
      if (!client_) {
        RelayClientOptions o = relay_of(cfg_, "diaspora-train-checkpoint");
        o.producer_id = producer_;
        client_ = std::make_unique<RelayClient>(std::move(o));
      }
      return items::put(*client_, cfg_.checkpoint_item_topic, seq, event, bytes);
    } catch (const RelayClientError&) {
      client_.reset();  // connected again on the next try
      throw;
    } catch (const items::ItemError& e) {
      throw RehearsalError(what + ": the relay refused it (" + e.code() + "): " + e.what());
    }
  });
  return data::item_uri(cfg_.checkpoint_item_topic, r.offset);
}

}  // namespace detail

fs::path fetch_checkpoint_item(const TrainerConfig& cfg, const std::string& uri, const fs::path& root, double patience_s) {
  const auto at = data::parse_item_uri(uri);
  if (!at) throw RehearsalError("--resume-item '" + uri + "' is not a diaspora://TOPIC/OFFSET URI");
  const items::Item item = with_patience(patience_s, "--resume-item " + uri, [&] {
    RelayClient client(relay_of(cfg, "diaspora-train-resume"));
    try {
      return items::fetch(client, at->topic, at->offset);
    } catch (const items::ItemError& e) {
      throw RehearsalError("--resume-item " + uri + ": " + e.what());
    }
  });
  auto bad = [&](const std::string& why) {
    return RehearsalError("--resume-item " + uri + " is not a checkpoint diaspora-train put: " + why);
  };
  const json::value* type = item.event.if_contains("type");
  const json::value* data = item.event.if_contains("data");
  if (!type || !type->is_string() || type->get_string() != events::DataItem::type || !data || !data->is_object())
    throw bad("its event is not an org.diaspora.data.item with data");
  events::DataItem d;
  try {
    d = events::from_json<events::DataItem>(*data);
  } catch (const std::exception& e) {
    throw bad(std::string("its data: ") + e.what());
  }
  if (d.content_type != kContentType) throw bad("its content_type is not " + std::string(kContentType));
  if (!d.seq || *d.seq < 0 || !d.files) throw bad("its data has no step (seq) or no files");
  std::size_t total = 0;
  bool manifest = false;
  for (const events::ItemFile& f : *d.files) {
    if (!plain_name(f.name)) throw bad("a file of data.files is not a plain name: " + f.name);
    const auto size = static_cast<std::size_t>(f.size);  // >= 0: the schema
    if (size > item.bytes.size() - std::min(total, item.bytes.size()))
      throw bad("its files add up to more than the item's " + std::to_string(item.bytes.size()) + " bytes");
    total += size;
    manifest |= f.name == "manifest.json";
  }
  if (total != item.bytes.size())
    throw bad("its files add up to " + std::to_string(total) + " bytes, the item holds " + std::to_string(item.bytes.size()));
  if (!manifest) throw bad("it has no manifest.json");
  const std::string ckpt = "ckpt-" + std::to_string(*d.seq);
  const fs::path dir = root / ckpt;
  fs::create_directories(dir);
  std::size_t at_byte = 0;
  for (const events::ItemFile& f : *d.files) {
    write_file_atomic(dir / f.name, std::string_view(item.bytes).substr(at_byte, static_cast<std::size_t>(f.size)));
    at_byte += static_cast<std::size_t>(f.size);
  }
  write_file_atomic(root / "LATEST", ckpt + "\n");  // last: a crash before it leaves the previous LATEST
  return root;
}

}  // namespace diaspora::rehearsal
