#include "live_view.hpp"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>

namespace diaspora::runner {

namespace {
std::string stamp(double t) {
  char b[32];
  std::snprintf(b, sizeof b, "[%7.1fs]", t);
  return b;
}
}  // namespace

void LiveView::say(const std::string& line) {
  erase();
  out_ << (ctx_.started ? stamp(ctx_.now()) : std::string("[  setup ]")) << " " << line << "\n";
  if (ctx_.opt.live_view) draw();
  out_.flush();
}

void LiveView::tick() {
  if (ctx_.started && ctx_.now() >= relay_next_) watch_relay(ctx_.now());
  if (!ctx_.opt.live_view || ctx_.now() < next_) return;
  erase();
  draw();
}

void LiveView::watch_relay(double t) {
  relay_next_ = t + 0.25;
  bool connected = false;
  events_acked_(&connected);
  if (connected) {
    if (relay_down_since_ >= 0) {
      char b[96];
      std::snprintf(b, sizeof b, "plugin: relay session back after %.1f s; the spooled events follow", t - relay_down_since_);
      say(b);
    }
    relay_down_since_ = -1;
    relay_said_.clear();
    return;
  }
  std::string why = last_error_();
  if (why.empty()) return;  // still making its first connection
  // The plugin's messages end with what it does about it, and a retry's delay: say each
  // reason once an outage, not at every retry (its publisher and control subscription
  // take turns).
  for (const char* tail : {" (retrying in ", " (unacked events went back"})
    if (auto at = why.find(tail); at != std::string::npos) why.resize(at);
  if (relay_down_since_ < 0) relay_down_since_ = t;
  if (!relay_said_.insert(why).second) return;
  say("plugin: " + why + " (the events are kept in its spool; retrying)");
}

void LiveView::erase() {
  if (!ctx_.opt.live_view || lines_ == 0) return;
  out_ << "\x1b[" << lines_ << "F\x1b[J";
  lines_ = 0;
}

void LiveView::draw() {
  const double t = ctx_.now();
  bool connected = false;
  const std::uint64_t acked = events_acked_(&connected);
  if (t - events_t_ >= 1) {
    rate_ = static_cast<double>(acked - events_) / std::max(1e-3, t - events_t_);
    events_ = acked;
    events_t_ = t;
  }
  long done = 0, failed = 0, running = 0;
  for (const auto& inst : store_.all()) {
    done += inst.state == InstanceState::completed;
    failed += inst.state == InstanceState::failed;
    running += inst.state == InstanceState::running;
  }
  std::ostringstream v;
  char b[256];
  std::snprintf(b, sizeof b, "\x1b[1m%s\x1b[0m  %.0f s  %zu instances: %ld done, %ld running, %zu queued, %ld failed  %.0f events/s%s\n",
                ctx_.spec.name.c_str(), t, store_.all().size(), done, running, store_.queue().size(), failed, rate_,
                connected ? "" : "  (relay unreachable: spooling)");
  v << b;
  int lines = 1;
  for (const auto& s : sites_.all()) {
    std::snprintf(b, sizeof b, "  %-16s running %ld/%zu  done %ld  failed %ld  health %.2f%s\n", s.name().c_str(), s.busy(),
                  s.slots.size(), s.completed, s.failed, sites_.health(s, t), s.drained ? "  (drained)" : "");
    v << b;
    ++lines;
  }
  const auto& acts = actions_.all();
  for (std::size_t i = acts.size() > 3 ? acts.size() - 3 : 0; i < acts.size(); ++i) {
    const auto& a = acts[i];
    std::string line = "  " + stamp(a.received_t) + " " + a.kind + " " + a.task + " (" + a.outcome + "): " + a.reason;
    if (line.size() > 150) line = line.substr(0, 147) + "...";
    v << line << "\n";
    ++lines;
  }
  out_ << v.str();
  out_.flush();
  lines_ = lines;
  next_ = t + 0.5;
}

}  // namespace diaspora::runner
