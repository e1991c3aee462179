#include "sites.hpp"

#include <algorithm>
#include <cmath>

#include "diaspora/site_health.hpp"

namespace diaspora::runner {

namespace {
constexpr double kFresh = 30;         // seconds: older step times say nothing about now
constexpr double kPenaltyDecay = 60;  // seconds
}  // namespace

long Site::busy() const {
  long n = 0;
  for (const auto& sl : slots) n += sl.busy();
  return n;
}

long Site::idle() const {
  long n = 0;
  for (const auto& sl : slots) n += sl.idle();
  return n;
}

Sites::Sites(const std::vector<SiteSpec>& specs) {
  for (const auto& ss : specs) {
    Site s;
    s.spec = &ss;
    for (int i = 0; i < ss.workers; ++i) {
      Slot slot;
      slot.index = i;
      s.slots.push_back(std::move(slot));
    }
    sites_.push_back(std::move(s));
  }
}

Site* Sites::find(const std::string& name) {
  for (auto& s : sites_)
    if (s.name() == name) return &s;
  return nullptr;
}

const Site* Sites::find(const std::string& name) const { return const_cast<Sites*>(this)->find(name); }

long Sites::idle() const {
  long n = 0;
  for (const auto& s : sites_) n += s.idle();
  return n;
}

void Sites::observe_step_time(Site& s, const std::string& task, double step_time, double t) {
  auto& e = s.step_time[task];
  const bool fresh = e.fast > 0 && t - e.t < kFresh;
  e.fast = fresh ? 0.8 * e.fast + 0.2 * step_time : step_time;
  e.slow = fresh ? 0.98 * e.slow + 0.02 * step_time : step_time;
  e.t = t;
}

void Sites::add_penalty(Site& s, double amount, double t) {
  s.penalty = penalty(s, t) + amount;
  s.penalty_t = t;
  s.failures = decay_failures(s.failures, t - s.failures_t) + amount;
  s.failures_t = t;
}

double Sites::health(const Site& s, double t) const {
  SiteHealthInputs in;
  for (const auto& [task, st] : s.step_time) in.speed = std::min(in.speed, speed(s, task, t));
  in.failures = decay_failures(s.failures, t - s.failures_t);
  return site_health(in);
}

double Sites::penalty(const Site& s, double t) { return s.penalty * std::exp(-(t - s.penalty_t) / kPenaltyDecay); }

double Sites::speed(const Site& s, const std::string& task, double t) const {
  auto it = s.step_time.find(task);
  if (it == s.step_time.end() || t - it->second.t > kFresh || it->second.fast <= 0) return 1.0;
  // The reference: this site's own longer-run step time, or the fastest site's recent one.
  double best = it->second.slow;
  for (const auto& o : sites_) {
    auto jt = o.step_time.find(task);
    if (jt != o.step_time.end() && t - jt->second.t <= kFresh && jt->second.fast > 0) best = std::min(best, jt->second.fast);
  }
  return std::clamp(best / it->second.fast, 0.01, 1.0);
}

}  // namespace diaspora::runner
