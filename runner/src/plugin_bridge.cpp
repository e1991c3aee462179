#include "plugin_bridge.hpp"

#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "diaspora/data_item.hpp"
#include "diaspora/error.hpp"

namespace diaspora::runner {

namespace {

// The ABI's task info for an attempt: its hook id, site and number.
diaspora_task_info info(const Attempt& a) {
  diaspora_task_info i{};
  i.struct_size = sizeof i;
  i.task_id = a.hook_id.c_str();
  i.site = a.site.empty() ? nullptr : a.site.c_str();
  i.attempt = a.number;
  i.step = -1;
  return i;
}

std::string clip(const std::string& s) { return s.substr(0, DIASPORA_MAX_TEXT); }

}  // namespace

PluginBridge::~PluginBridge() {
  if (plugin_) close(2000);
}

void PluginBridge::open(const std::filesystem::path& library, const boost::json::value& document) {
  lib_ = &load_plugin(library);
  char err[8192] = {0};
  const std::string yaml = boost::json::serialize(document);  // JSON is YAML
  if (lib_->open_yaml(yaml.c_str(), &plugin_, err, sizeof err) != DIASPORA_OK)
    throw Error(std::string("the plugin refused the spec: ") + err);
  lib_->set_action_callback(plugin_, &PluginBridge::on_action, this);
}

void PluginBridge::on_action(const diaspora_action* a, void* user) {
  auto* self = static_cast<PluginBridge*>(user);
  {
    std::lock_guard<std::mutex> lk(self->mu_);
    self->incoming_.push_back(*a);
  }
  const char c = 'a';
  [[maybe_unused]] auto r = ::write(self->wake_fd_, &c, 1);
}

std::deque<diaspora_action> PluginBridge::take_actions() {
  std::deque<diaspora_action> batch;
  std::lock_guard<std::mutex> lk(mu_);
  batch.swap(incoming_);
  return batch;
}

diaspora_stats PluginBridge::stats() const {
  diaspora_stats st{};
  st.struct_size = sizeof st;
  if (plugin_) lib_->get_stats(plugin_, &st);
  return st;
}

std::string PluginBridge::last_error() const {
  if (!plugin_) return {};
  // Room for what it holds now and some: it may change between the two calls (then it is
  // cut, always terminated).
  std::vector<char> buf(lib_->last_error(plugin_, nullptr, 0) + 256);
  lib_->last_error(plugin_, buf.data(), buf.size());
  return std::string(buf.data());
}

void PluginBridge::stop_actions() {
  if (plugin_) lib_->set_action_callback(plugin_, nullptr, nullptr);
}

diaspora_stats PluginBridge::drain(double timeout_s) const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  diaspora_stats st = stats();
  while (std::chrono::steady_clock::now() < until) {
    if (st.events_acked + st.events_lost + st.events_rejected >= st.events_accepted && st.spool_records == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    st = stats();
  }
  return st;
}

int PluginBridge::close(int timeout_ms) {
  if (!plugin_) return DIASPORA_OK;
  lib_->set_action_callback(plugin_, nullptr, nullptr);
  const int rc = lib_->close(plugin_, timeout_ms);
  plugin_ = nullptr;
  return rc;
}

void PluginBridge::task_submitted(const Attempt& a, const std::string& task_name, double deadline_s) {
  auto i = info(a);
  i.name = task_name.c_str();
  i.attempt = 0;
  if (deadline_s > 0) i.deadline_s = deadline_s;
  lib_->task_submitted(plugin_, &i);
}

void PluginBridge::task_started(const Attempt& a, const std::string& worker) {
  auto i = info(a);
  i.worker = worker.c_str();
  lib_->task_started(plugin_, &i);
}

void PluginBridge::task_progress(const Attempt& a, double progress, long step, std::span<const diaspora_metric_value> metrics) {
  auto i = info(a);
  i.progress = progress;
  i.step = step;
  i.metrics = metrics.empty() ? nullptr : metrics.data();
  i.metric_count = metrics.size();
  lib_->task_progress(plugin_, &i);
}

void PluginBridge::task_heartbeat(const Attempt& a, std::span<const diaspora_metric_value> metrics) {
  auto i = info(a);
  i.metrics = metrics.empty() ? nullptr : metrics.data();
  i.metric_count = metrics.size();
  lib_->task_heartbeat(plugin_, &i);
}

void PluginBridge::task_progress_line(const Attempt& a, const ProgressLine& line) {
  auto i = info(a);
  std::vector<diaspora_metric_value> mv;
  switch (adapters::apply_progress_line(line, i, mv)) {
    case adapters::ProgressHook::progress: lib_->task_progress(plugin_, &i); break;
    case adapters::ProgressHook::heartbeat: lib_->task_heartbeat(plugin_, &i); break;
    case adapters::ProgressHook::none: break;
  }
}

void PluginBridge::task_completed(const Attempt& a) {
  auto i = info(a);
  i.has_exit_code = 1;
  lib_->task_completed(plugin_, &i);
}

void PluginBridge::task_failed(const Attempt& a, bool retryable, const std::string& reason) {
  auto i = info(a);
  i.retryable = retryable ? 1 : 0;
  if (a.exit_code) {
    i.has_exit_code = 1;
    i.exit_code = *a.exit_code;
  }
  // A stop for an action is neither: the action is its retry.
  if (!retryable) i.failure = a.own_error ? DIASPORA_FAILURE_ERROR : DIASPORA_FAILURE_LOST;
  const std::string r = clip(reason);
  i.reason = r.c_str();
  lib_->task_failed(plugin_, &i);
}

void PluginBridge::task_cancelled(const Attempt& a, const std::string& reason) {
  auto i = info(a);
  const std::string r = clip(reason);
  i.reason = r.c_str();
  lib_->task_cancelled(plugin_, &i);
}

void PluginBridge::data_arrived(const std::string& stream, long seq, long bytes, const std::string& uri,
                                const std::string& checksum, const std::string& site) {
  diaspora_data_info d{};
  d.struct_size = sizeof d;
  d.stream = stream.c_str();
  d.seq = seq;
  d.bytes = bytes;
  d.uri = uri.c_str();
  d.checksum = checksum.empty() ? nullptr : checksum.c_str();
  d.site = site.c_str();
  lib_->data_arrived(plugin_, &d);
}

std::string PluginBridge::put_item(const std::string& topic, const std::string& stream, long seq, const std::string& site,
                                   const std::string& bytes, std::int64_t timeout_ms) const {
  if (!plugin_) throw Error("the plugin is not open");
  diaspora_item_info info{};
  info.struct_size = sizeof info;
  info.bytes = bytes.data();
  info.size = bytes.size();
  info.topic = topic.c_str();
  info.stream = stream.c_str();
  info.seq = seq;
  info.site = site.empty() ? nullptr : site.c_str();
  info.timeout_ms = timeout_ms;
  diaspora_item_ref ref{};
  ref.struct_size = sizeof ref;
  if (const int rc = lib_->item_put(plugin_, &info, &ref); rc != DIASPORA_OK)
    throw Error(std::string("item put: ") + lib_->status_name(rc) + ": " + last_error());
  return data::item_uri(ref.topic, ref.offset);
}

void PluginBridge::resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                            const std::string& metric, double value) {
  diaspora_metric_value mv{metric.c_str(), value};
  diaspora_resource_info r{};
  r.struct_size = sizeof r;
  r.resource_id = id.c_str();
  r.kind = kind;
  r.state = state;
  r.site = site.empty() ? nullptr : site.c_str();
  r.metrics = metric.empty() ? nullptr : &mv;
  r.metric_count = metric.empty() ? 0 : 1;
  lib_->resource_status(plugin_, &r);
}

void PluginBridge::action_result(const std::string& action_id, bool ok, const std::string& message) {
  const std::string m = clip(message);
  if (ok) lib_->action_done(plugin_, action_id.c_str(), m.c_str());
  else lib_->action_failed(plugin_, action_id.c_str(), m.c_str());
}

}  // namespace diaspora::runner
