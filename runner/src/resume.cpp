#include "resume.hpp"

#include <boost/json/parse.hpp>

#include <chrono>

#include "diaspora/topic_reader.hpp"

namespace diaspora::runner {

namespace json = boost::json;

std::string instance_of(const std::string& hook_id) { return hook_id.substr(0, hook_id.find('@')); }

std::uint64_t read_topic(const std::string& url, const std::filesystem::path& ca_file, const std::filesystem::path& token_file,
                         const std::string& topic, double limit_s, const std::function<void(const json::object&)>& each) {
  TopicReader reader(relay_options_from_files(url, ca_file, token_file, "diaspora-run-reader"), topic);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (std::chrono::steady_clock::now() < until) {
    const auto events = reader.poll(std::chrono::milliseconds(1000));
    if (events.empty()) break;  // a second with nothing more: the log is read
    for (const json::object& e : events) each(e);
  }
  return reader.delivered();
}

PriorRun read_prior_run(const std::string& url, const std::filesystem::path& ca_file,
                        const std::filesystem::path& token_file, const std::string& topic, double limit_s) {
  PriorRun prior;
  prior.events = read_topic(url, ca_file, token_file, topic, limit_s, [&](const json::object& e) {
    const json::value* type = e.if_contains("type");
    const json::value* subject = e.if_contains("subject");
    if (!type || !type->is_string() || !subject || !subject->is_string()) return;
    const std::string t(type->get_string()), id = instance_of(std::string(subject->get_string()));
    if (!t.starts_with("org.diaspora.task.")) return;
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
  });
  return prior;
}

}  // namespace diaspora::runner
