#include "plugin_set.hpp"

#include <chrono>

#include "diaspora/error.hpp"

namespace diaspora::runner {

namespace {

// An attempt's key: its hook id and number (a speculative copy has a hook id of its own).
std::string key_of(const Attempt& a) { return a.hook_id + "#" + std::to_string(a.number); }

}  // namespace

void PluginSet::open(const std::filesystem::path& library, const boost::json::value& document,
                     const std::vector<std::pair<std::string, boost::json::value>>& sites) {
  bridges_.push_back(std::make_unique<PluginBridge>(wake_fd_));
  names_.emplace_back();
  bridges_.back()->open(library, document);
  for (const auto& [site, doc] : sites) {
    bridges_.push_back(std::make_unique<PluginBridge>(wake_fd_));
    names_.push_back(site);
    try {
      bridges_.back()->open(library, doc);
    } catch (const Error& e) {
      throw Error("site " + site + "'s relay: " + e.what());
    }
    site_plugin_[site] = bridges_.size() - 1;
  }
}

std::deque<diaspora_action> PluginSet::take_actions() {
  std::deque<diaspora_action> out;
  for (std::size_t i = 0; i < bridges_.size(); ++i)
    for (diaspora_action& a : bridges_[i]->take_actions())
      if (actions_.emplace(a.id, i).second) out.push_back(a);  // else: delivered by another plugin already
  return out;
}

diaspora_stats PluginSet::stats() const {
  diaspora_stats sum{};
  sum.struct_size = sizeof sum;
  sum.connected = sum.control_connected = 1;
  for (const auto& b : bridges_) {
    const diaspora_stats st = b->stats();
    sum.events_accepted += st.events_accepted;
    sum.events_acked += st.events_acked;
    sum.events_spilled += st.events_spilled;
    sum.metrics_coalesced += st.metrics_coalesced;
    sum.events_lost += st.events_lost;
    sum.spool_records += st.spool_records;
    sum.spool_bytes += st.spool_bytes;
    sum.reconnects += st.reconnects;
    sum.invalid_transitions += st.invalid_transitions;
    sum.actions_received += st.actions_received;
    sum.events_rejected += st.events_rejected;
    sum.connected = sum.connected && st.connected;
    sum.control_connected = sum.control_connected && st.control_connected;
  }
  return sum;
}

std::string PluginSet::last_error() const {
  for (std::size_t i = 0; i < bridges_.size(); ++i)
    if (std::string e = bridges_[i]->last_error(); !e.empty()) return i == 0 ? e : "site " + names_[i] + "'s relay: " + e;
  return {};
}

void PluginSet::stop_actions() {
  for (auto& b : bridges_) b->stop_actions();
}

diaspora_stats PluginSet::drain(double timeout_s) const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (const auto& b : bridges_)
    b->drain(std::max(0.0, std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count()));
  return stats();
}

int PluginSet::close(int timeout_ms) {
  int rc = DIASPORA_OK;
  for (auto& b : bridges_)
    if (const int r = b->close(timeout_ms); rc == DIASPORA_OK) rc = r;
  return rc;
}

std::string PluginSet::put_item(const std::string& topic, const std::string& stream, long seq, const std::string& site,
                                const std::string& bytes, std::int64_t timeout_ms) const {
  auto it = site_plugin_.find(site);  // read only: site_plugin_ and bridges_ are set by open()
  return bridges_[it == site_plugin_.end() ? 0 : it->second]->put_item(topic, stream, seq, site, bytes, timeout_ms);
}

PluginBridge& PluginSet::of_site(const std::string& site) {
  auto it = site_plugin_.find(site);
  return *bridges_[it == site_plugin_.end() ? 0 : it->second];
}

PluginBridge& PluginSet::of_attempt(const Attempt& a, bool ends) {
  if (site_plugin_.empty()) return *bridges_.front();  // one relay: nothing to route
  const std::string key = key_of(a);
  std::size_t i = 0;
  if (auto p = placed_.find(key); p != placed_.end()) {
    i = p->second;
  } else {
    if (auto s = site_plugin_.find(a.site); s != site_plugin_.end()) i = s->second;
    if (auto h = held_.find(key); h != held_.end()) {
      bridges_[i]->task_submitted(a, h->second.task_name, h->second.deadline_s);
      told_.emplace(i, a.hook_id);
      held_.erase(h);
    } else if (auto first = submitted_.find(a.hook_id); first != submitted_.end() && told_.emplace(i, a.hook_id).second) {
      // An attempt started without a submission of its own (a restart or migration) at a
      // site whose plugin never saw the task: its submission first, or that plugin would
      // take the start for a lifecycle out of order (and warn).
      bridges_[i]->task_submitted(a, first->second.task_name, first->second.deadline_s);
    }
    placed_[key] = i;
  }
  if (ends) placed_.erase(key);
  return *bridges_[i];
}

void PluginSet::task_submitted(const Attempt& a, const std::string& task_name, double deadline_s) {
  if (site_plugin_.empty()) return bridges_.front()->task_submitted(a, task_name, deadline_s);
  held_[key_of(a)] = Held{task_name, deadline_s};  // told once the attempt has a site
  submitted_.emplace(a.hook_id, Held{task_name, deadline_s});
}

void PluginSet::task_started(const Attempt& a, const std::string& worker) { of_attempt(a).task_started(a, worker); }

void PluginSet::task_progress(const Attempt& a, double progress, long step, std::span<const diaspora_metric_value> metrics) {
  of_attempt(a).task_progress(a, progress, step, metrics);
}

void PluginSet::task_heartbeat(const Attempt& a, std::span<const diaspora_metric_value> metrics) {
  of_attempt(a).task_heartbeat(a, metrics);
}

void PluginSet::task_progress_line(const Attempt& a, const ProgressLine& line) { of_attempt(a).task_progress_line(a, line); }

void PluginSet::task_completed(const Attempt& a) { of_attempt(a, true).task_completed(a); }

void PluginSet::task_failed(const Attempt& a, bool retryable, const std::string& reason) {
  of_attempt(a, true).task_failed(a, retryable, reason);
}

void PluginSet::task_cancelled(const Attempt& a, const std::string& reason) {
  of_attempt(a, true).task_cancelled(a, reason);
}

void PluginSet::data_arrived(const std::string& stream, long seq, long bytes, const std::string& uri,
                             const std::string& checksum, const std::string& site) {
  of_site(site).data_arrived(stream, seq, bytes, uri, checksum, site);
}

void PluginSet::resource(const std::string& id, const char* kind, const char* state, const std::string& site,
                         const std::string& metric, double value) {
  of_site(site).resource(id, kind, state, site, metric, value);
}

void PluginSet::action_result(const std::string& action_id, bool ok, const std::string& message) {
  auto it = actions_.find(action_id);
  bridges_[it == actions_.end() ? 0 : it->second]->action_result(action_id, ok, message);
}

}  // namespace diaspora::runner
