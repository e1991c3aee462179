#include "resume.hpp"

#include <boost/json/parse.hpp>

#include <chrono>
#include <fstream>
#include <sstream>

#include "diaspora/client.hpp"

namespace diaspora::run {

namespace json = boost::json;

std::string instance_of(const std::string& hook_id) { return hook_id.substr(0, hook_id.find('@')); }

PriorRun read_prior_run(const std::string& url, const std::filesystem::path& ca_file,
                        const std::filesystem::path& token_file, const std::string& topic, double limit_s) {
  std::ifstream f(token_file);
  std::string token;
  std::getline(f, token);
  RelayClientOptions o;
  o.url = url;
  o.ca_file = ca_file;
  o.token = token;
  o.client_id = "diaspora-run-resume";
  RelayClient c(o);
  c.send(frames::subscribe("resume", topic, frames::From("earliest")));
  PriorRun prior;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (std::chrono::steady_clock::now() < until) {
    auto frame = c.poll_receive(std::chrono::milliseconds(1000));
    if (!frame) break;  // a second with nothing more: the log is read
    auto m = RelayClient::parse_frame(*frame);
    if (!m) continue;
    const json::value* op = m->if_contains("op");
    if (op && op->is_string() && op->get_string() == "error")
      throw RelayClientError("the relay refused to read " + topic + " back: " + std::string(*frame).substr(0, 300));
    const json::value* events = m->if_contains("events");
    if (!events || !events->is_array()) continue;
    for (const auto& item : events->get_array()) {
      if (!item.is_object() || !item.get_object().contains("event")) continue;
      const json::value& ev = item.get_object().at("event");
      if (!ev.is_object()) continue;
      ++prior.events;
      const json::object& e = ev.get_object();
      const json::value* type = e.if_contains("type");
      const json::value* subject = e.if_contains("subject");
      if (!type || !type->is_string() || !subject || !subject->is_string()) continue;
      const std::string t(type->get_string()), id = instance_of(std::string(subject->get_string()));
      if (!t.starts_with("org.diaspora.task.")) continue;
      if (t == "org.diaspora.task.completed") prior.completed.insert(id);
      if (t == "org.diaspora.task.submitted") {
        const auto dot = id.rfind('.');
        if (dot != std::string::npos && dot + 1 < id.size() && id.find_first_not_of("0123456789", dot + 1) == std::string::npos) {
          long& hi = prior.submitted.try_emplace(id.substr(0, dot), -1).first->second;
          hi = std::max(hi, std::stol(id.substr(dot + 1)));
        }
      }
      if (t == "org.diaspora.task.started") {
        const json::value* data = e.if_contains("data");
        const json::value* at = data && data->is_object() ? data->get_object().if_contains("attempt") : nullptr;
        int n = at && at->is_int64() ? static_cast<int>(at->get_int64()) : 1;
        int& hi = prior.attempts[std::string(subject->get_string())];
        hi = std::max(hi, n);
      }
    }
  }
  c.close();
  return prior;
}

}  // namespace diaspora::run
