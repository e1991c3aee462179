#include "scan_feed.hpp"

#include <boost/json/value.hpp>

#include <chrono>
#include <thread>

#include "diaspora/data_item.hpp"
#include "diaspora/event.hpp"  // parse_rfc3339_us
#include "diaspora/files.hpp"
#include "diaspora/items.hpp"
#include "diaspora/rehearsal.hpp"
#include "diaspora/topic_reader.hpp"
#include "fabric.hpp"

namespace diaspora::rehearsal::detail {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

ScanFeed::ScanFeed(DatasetConfig d) : d_(std::move(d)) {}
ScanFeed::~ScanFeed() = default;

void ScanFeed::take(const std::string& uri, std::int64_t seq, std::int64_t time_us) {
  if (const auto at = data::parse_item_uri(uri)) {  // a data item on the relay (docs/streaming.md)
    if (!d_.item_topic.empty() && at->topic != d_.item_topic) return;
    if (d_.since_us > 0 && time_us < d_.since_us) return;  // an earlier run's, on a shared relay
    if (!paths_.contains(seq)) items_.try_emplace(seq, *at);
    return;
  }
  constexpr std::string_view scheme = "file://";
  if (!uri.starts_with(scheme) || uri.size() == scheme.size() || uri[scheme.size()] != '/')
    throw RehearsalError("scan " + std::to_string(seq) + " of stream '" + d_.stream + "' on " + d_.topic +
                         " has the URI '" + uri +
                         "': ptycho-stream reads file:///absolute/path and diaspora://TOPIC/OFFSET URIs only");
  const std::string path = uri.substr(scheme.size());
  if (!d_.scan_dir.empty()) {  // another run's scan on a shared relay log: not this stream's
    const std::string dir = d_.scan_dir.ends_with('/') ? d_.scan_dir : d_.scan_dir + "/";
    if (!path.starts_with(dir)) return;
  }
  paths_.try_emplace(seq, path);  // the first announcement of a seq counts
}

std::optional<std::filesystem::path> ScanFeed::wait_for(std::int64_t seq, const std::atomic<int>* stop) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(d_.wait_s);
  while (!paths_.contains(seq)) {
    if (stop && stop->load() != 0) return std::nullopt;
    if (items_.contains(seq)) {
      if (fetch(seq)) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));  // the relay is away: again once it is back
      if (Clock::now() < deadline) continue;
    }
    if (Clock::now() >= deadline)
      throw RehearsalError("scan " + std::to_string(seq) + " of stream '" + d_.stream + "' did not arrive on " + d_.topic +
                           " at " + d_.relay + " within dataset.wait (" + std::to_string(static_cast<long>(d_.wait_s)) +
                           " s; " + std::to_string(paths_.size()) + " scans seen" +
                           (last_error_.empty() ? std::string() : "; last relay error: " + last_error_) + ")");
    try {
      if (!reader_)
        reader_ = std::make_unique<TopicReader>(
            fabric_options(d_.relay, d_.ca_file, d_.token_file, "diaspora-train-feed"), d_.topic);
      for (const json::object& e : reader_->poll(std::chrono::milliseconds(200))) {
        const json::value* type = e.if_contains("type");
        const json::value* data = e.if_contains("data");
        if (!type || !type->is_string() || type->get_string() != "org.diaspora.data.arrived" || !data || !data->is_object())
          continue;
        const json::object& o = data->get_object();
        const json::value* stream = o.if_contains("stream");
        const json::value* s = o.if_contains("seq");
        const json::value* uri = o.if_contains("uri");
        if (!stream || !stream->is_string() || stream->get_string() != d_.stream || !s || !s->is_int64() || !uri ||
            !uri->is_string())
          continue;
        const json::value* time = e.if_contains("time");
        const auto time_us = time && time->is_string() ? parse_rfc3339_us(time->get_string()) : std::nullopt;
        take(std::string(uri->get_string()), s->get_int64(), time_us.value_or(0));
      }
    } catch (const RelayClientError& e) {
      last_error_ = e.what();  // the relay is away (restarting, stopped): read the log again once it is back
      reader_.reset();
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  return std::filesystem::path(paths_.at(seq));
}

bool ScanFeed::fetch(std::int64_t seq) {
  const data::ItemLocation& at = items_.at(seq);
  try {
    if (!fetcher_)
      fetcher_ = std::make_unique<RelayClient>(fabric_options(d_.relay, d_.ca_file, d_.token_file, "diaspora-train-fetch"));
    const items::Item item = items::fetch(*fetcher_, at.topic, at.offset);
    const std::filesystem::path path =
        std::filesystem::path(d_.cache_dir) / (d_.stream + "-" + std::to_string(seq) + ".scan");
    std::filesystem::create_directories(path.parent_path());
    write_file_atomic(path, item.bytes, 0644, Durability::file);
    paths_[seq] = path.string();
    items_.erase(seq);
    return true;
  } catch (const items::ItemError& e) {
    throw RehearsalError("scan " + std::to_string(seq) + " of stream '" + d_.stream + "' at " +
                         data::item_uri(at.topic, at.offset) + ": " + e.what());
  } catch (const RelayClientError& e) {
    fetcher_.reset();  // connected again on the next try
    last_error_ = e.what();
    return false;
  }
}

}  // namespace diaspora::rehearsal::detail
