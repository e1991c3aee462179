#include "consumer_groups.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/json.hpp>

#include "diaspora/files.hpp"

namespace diaspora::relay {

namespace fs = std::filesystem;
namespace json = boost::json;

ConsumerGroups::ConsumerGroups(fs::path dir, std::size_t max_groups, std::function<void(const std::string&)> log)
    : dir_(std::move(dir)), max_groups_(max_groups), log_(std::move(log)) {
  load();
}

void ConsumerGroups::load() {
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string file = e.path().filename().string();
    if (file.size() > 9 && file.ends_with(".json.tmp")) {  // an interrupted commit: the old file is intact
      std::error_code ec;
      fs::remove(e.path(), ec);
      continue;
    }
    if (!e.is_regular_file() || !file.ends_with(".json")) continue;
    const std::string group = file.substr(0, file.size() - 5);
    auto reject = [&](const std::string& why) { log_("ignoring consumer group file " + e.path().string() + ": " + why); };
    if (!valid_topic_name(group)) {
      reject("not a valid group name");
      continue;
    }
    std::string text;
    {
      const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        reject(storage::errno_text(errno));
        continue;
      }
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
      ::close(fd);
      if (n < 0) {
        reject(storage::errno_text(errno));
        continue;
      }
    }
    boost::system::error_code ec;
    json::value v = json::parse(text, ec);
    if (ec) {
      reject("bad JSON: " + ec.message());
      continue;
    }
    const json::object* o = v.if_object();
    const json::value* offs = o ? o->if_contains("offsets") : nullptr;
    if (!offs || !offs->is_object()) {
      reject("no \"offsets\" object");
      continue;
    }
    std::map<std::string, std::uint64_t> offsets;
    std::string problem;
    for (const auto& [topic, off] : offs->get_object()) {
      if (!valid_topic_name(topic)) {
        problem = "bad topic name";
        break;
      }
      if (off.is_uint64()) {
        offsets[std::string(topic)] = off.get_uint64();
      } else if (off.is_int64() && off.get_int64() >= 0) {
        offsets[std::string(topic)] = static_cast<std::uint64_t>(off.get_int64());
      } else {
        problem = "offset of topic '" + std::string(topic) + "' is not a non-negative integer";
        break;
      }
    }
    if (!problem.empty()) {
      reject(problem);
      continue;
    }
    groups_[group] = std::move(offsets);
  }
}

void ConsumerGroups::commit(const std::string& group, const std::string& topic, std::uint64_t offset) {
  if (!valid_topic_name(group)) throw Error("invalid consumer group name '" + group + "'");
  if (!valid_topic_name(topic)) throw Error("invalid topic name '" + topic + "'");
  std::lock_guard wl(write_mu_);
  std::map<std::string, std::uint64_t> offsets;
  {
    std::lock_guard lk(mu_);
    if (auto it = groups_.find(group); it != groups_.end()) offsets = it->second;
    else if (groups_.size() >= max_groups_)
      throw GroupLimitError("the relay keeps at most " + std::to_string(max_groups_) +
                            " consumer groups (limits.max_consumer_groups) and has as many: commit with a group that "
                            "exists, or raise the limit");
  }
  offsets[topic] = offset;

  json::object offs;
  for (const auto& [t, o] : offsets) offs[t] = o;
  const std::string text = json::serialize(json::object{{"group", group}, {"offsets", std::move(offs)}}) + "\n";
  try {
    // After a crash the file is the old or the new one.
    write_file_atomic(dir_ / (group + ".json"), text);
  } catch (const Error& e) {
    throw Error("cannot save consumer group '" + group + "': " + e.what());
  }
  std::lock_guard lk(mu_);
  groups_[group] = std::move(offsets);
}

std::optional<std::uint64_t> ConsumerGroups::offset(const std::string& group, const std::string& topic) const {
  std::lock_guard lk(mu_);
  auto g = groups_.find(group);
  if (g == groups_.end()) return std::nullopt;
  auto t = g->second.find(topic);
  if (t == g->second.end()) return std::nullopt;
  return t->second;
}

std::vector<std::tuple<std::string, std::string, std::uint64_t>> ConsumerGroups::all() const {
  std::lock_guard lk(mu_);
  std::vector<std::tuple<std::string, std::string, std::uint64_t>> out;
  for (const auto& [g, offs] : groups_)
    for (const auto& [t, o] : offs) out.emplace_back(g, t, o);
  return out;
}

}  // namespace diaspora::relay
