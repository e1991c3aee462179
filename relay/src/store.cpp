#include "store.hpp"

#include <algorithm>

#include "diaspora/token.hpp"

namespace diaspora::relay {

bool valid_topic_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

bool valid_topic_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 200 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), valid_topic_char);
}

Retention retention_of(std::string_view topic, const std::vector<TopicRetention>& rules, Retention fallback) noexcept {
  for (const auto& r : rules)
    if (topic_matches(r.pattern, topic)) return r.retention;
  return fallback;
}

bool any_bounded(const std::vector<TopicRetention>& rules, Retention fallback) noexcept {
  return fallback.bounded() || std::any_of(rules.begin(), rules.end(), [](const TopicRetention& r) { return r.retention.bounded(); });
}

std::vector<StoredRecord> Store::read(const std::string& topic, std::uint64_t from, std::size_t max_records,
                                      std::size_t max_bytes) const {
  std::vector<StoredRecord> out;
  visit(topic, from, max_records, max_bytes,
        [&](const RecordRef& r) { out.push_back(StoredRecord{r.offset, r.time_us, std::string(r.payload)}); });
  return out;
}

}  // namespace diaspora::relay
