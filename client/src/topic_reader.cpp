#include "diaspora/topic_reader.hpp"

#include <boost/json/value.hpp>

#include <fstream>

namespace diaspora {

namespace json = boost::json;

RelayClientOptions relay_options_from_files(const std::string& url, const std::filesystem::path& ca_file,
                                            const std::filesystem::path& token_file, const std::string& client_id) {
  std::ifstream f(token_file);
  std::string token;
  if (!f || !std::getline(f, token) || token.empty())
    throw RelayClientError("cannot read a token from " + token_file.string() + " (its first line is the bearer token)");
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
  auto frame = client_->poll_receive(wait);
  while (frame) {
    if (auto m = RelayClient::parse_frame(*frame)) {
      const json::value* op = m->if_contains("op");
      if (op && op->is_string() && op->get_string() == "error")
        throw RelayClientError("the relay refused to read " + topic_ + " back: " + frame->substr(0, 300));
      const json::value* events = m->if_contains("events");
      if (events && events->is_array())
        for (const auto& item : events->get_array()) {
          if (!item.is_object()) continue;
          const json::value* ev = item.get_object().if_contains("event");
          if (!ev || !ev->is_object()) continue;
          out.push_back(ev->get_object());
          ++delivered_;
        }
    }
    frame = client_->poll_receive(std::chrono::milliseconds(0));  // take what is already here
  }
  return out;
}

}  // namespace diaspora
