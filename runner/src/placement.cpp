#include "placement.hpp"

#include <algorithm>

namespace diaspora::runner {

namespace {
double declared(const Site& s) { return s.spec->speed / (1.0 + 0.1 * s.spec->cost); }
}  // namespace

bool Placement::feasible(const Site& s, const TaskSpec& ts, const Attempt& a) const {
  if (s.remote() && !ts.kind) return false;  // commands and rehearsal jobs run on local sites
  if (s.drained) return false;
  if (!a.pin_site.empty()) return s.name() == a.pin_site;
  if (!a.avoid_site.empty() && s.name() == a.avoid_site) return false;
  return ts.allowed_sites.empty() ||
         std::find(ts.allowed_sites.begin(), ts.allowed_sites.end(), s.name()) != ts.allowed_sites.end();
}

double Placement::speed(const Site& s, const std::string& task, double t) const {
  return ctx_.baseline() ? 1.0 : sites_.speed(s, task, t);
}

double Placement::score(const Site& s, const std::string& task, double t) const {
  if (ctx_.baseline()) return declared(s);
  return declared(s) * speed(s, task, t) / (1.0 + Sites::penalty(s, t));
}

// A failed attempt waiting for the policies' decision keeps a worker of its site for the
// recovering attempt: first attempts do not take the last free ones.
Slot* Placement::free_slot(Site& s, bool first_attempt) const {
  Slot* found = nullptr;
  long idle = 0;
  for (auto& sl : s.slots)
    if (sl.idle()) {
      ++idle;
      if (!found) found = &sl;
    }
  if (found && first_attempt && idle <= store_.reserved(s.name())) return nullptr;
  return found;
}

Placement::Choice Placement::choose(const Instance& inst, const Attempt& a, double t) const {
  const TaskSpec& ts = ctx_.task(inst.task);
  // Preferred sites first, in order, while they are in good standing (no recent failures
  // or moves off them).
  for (const auto& name : ts.preferred_sites) {
    Site* s = sites_.find(name);
    if (s && feasible(*s, ts, a) && score(*s, ts.name, t) > 0.5 * declared(*s))
      if (Slot* sl = free_slot(*s, a.first())) return {s, sl};
  }
  // A site running this task at under half its speed is used only when no allowed site
  // runs it well: waiting for a worker there is shorter than running slowly here.
  bool healthy_elsewhere = false;
  for (auto& s : sites_.all()) healthy_elsewhere |= feasible(s, ts, a) && speed(s, ts.name, t) >= 0.5;
  Choice best;
  double best_score = -1;
  for (auto& s : sites_.all()) {
    if (!feasible(s, ts, a)) continue;
    if (healthy_elsewhere && speed(s, ts.name, t) < 0.5) continue;
    Slot* sl = free_slot(s, a.first());
    if (!sl) continue;
    const double busy = static_cast<double>(s.busy()) / static_cast<double>(s.slots.size());
    const double sc = score(s, ts.name, t) * (1.0 - 0.5 * busy);
    if (sc > best_score) best = {&s, sl}, best_score = sc;
  }
  return best;
}

}  // namespace diaspora::runner
