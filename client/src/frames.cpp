// The diaspora.v1 frame builders (kept out of client.cpp, which instantiates Beast).
#include <boost/json.hpp>

#include "diaspora/client.hpp"

namespace diaspora::frames {

namespace json = boost::json;

std::string publish_head(std::string_view topic, std::uint64_t seq) {
  std::string head;
  head.reserve(topic.size() + 64);
  head += R"({"op":"publish","topic":)";
  head += json::serialize(json::string_view(topic.data(), topic.size()));
  head += R"(,"seq":)";
  head += std::to_string(seq);
  head += R"(,"events":[)";
  return head;
}

std::string publish(std::string_view topic, std::uint64_t seq, const std::vector<std::string_view>& events) {
  std::string frame = publish_head(topic, seq);
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (i) frame += ',';
    frame += events[i];
  }
  frame += kPublishTail;
  return frame;
}

std::string subscribe(std::string_view id, std::string_view topic_pattern, From from, std::string_view group) {
  json::object sub{{"op", "subscribe"}, {"id", id}, {"topic", topic_pattern}};
  if (from.position.empty()) sub["from"] = from.offset;
  else sub["from"] = from.position;
  if (!group.empty()) sub["group"] = group;
  return json::serialize(sub);
}

std::string commit(std::string_view group, std::string_view topic, std::uint64_t offset) {
  return json::serialize(json::object{{"op", "commit"}, {"group", group}, {"topic", topic}, {"offset", offset}});
}

}  // namespace diaspora::frames
