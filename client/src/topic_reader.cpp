#include "diaspora/topic_reader.hpp"

#include <boost/json/value.hpp>

#include <algorithm>

#include "diaspora/token.hpp"

namespace diaspora {

namespace json = boost::json;

RelayClientOptions relay_options_from_files(const std::string& url, const std::filesystem::path& ca_file,
                                            const std::filesystem::path& token_file, const std::string& client_id) {
  std::string token;
  try {
    token = load_token_file(token_file);  // core's one reader (trimmed), as every other client
  } catch (const Error& e) {
    throw RelayClientError(std::string("cannot read a token: ") + e.what());
  }
  RelayClientOptions o;
  o.url = url;
  o.ca_file = ca_file;
  o.token = token;
  o.client_id = client_id;
  return o;
}

TopicReader::TopicReader(const RelayClientOptions& options, const std::string& topic)
    : client_(std::make_unique<RelayClient>(options)), topic_(topic) {
  client_->send(frames::subscribe("read", topic, frames::From("earliest")));
}

TopicReader::~TopicReader() {
  if (client_) client_->close();
}

std::vector<json::object> TopicReader::poll(std::chrono::milliseconds wait) {
  std::vector<json::object> out;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    // Until the first event: wait out `wait` (frames that carry no event, such as the
    // subscription's confirmation, do not end it); then take only what is already here.
    auto left = std::chrono::milliseconds(0);
    if (out.empty())
      left = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         deadline - std::chrono::steady_clock::now()));
    auto frame = client_->poll_receive(left);
    if (!frame) return out;
    auto m = RelayClient::parse_frame(*frame);
    if (!m) continue;
    const json::value* op = m->if_contains("op");
    if (op && op->is_string() && op->get_string() == "error")
      throw RelayClientError("the relay refused to read " + topic_ + " back: " + frame->substr(0, 300));
    const json::value* events = m->if_contains("events");
    if (!events || !events->is_array()) continue;
    for (const auto& item : events->get_array()) {
      if (!item.is_object()) continue;
      const json::value* ev = item.get_object().if_contains("event");
      if (!ev || !ev->is_object()) continue;
      out.push_back(ev->get_object());
      ++delivered_;
    }
  }
}

}  // namespace diaspora
