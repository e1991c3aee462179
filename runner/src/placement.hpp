// Placement: which free worker an attempt waiting in the queue gets. Filter, then score
// (as Nomad's scheduler): a site is feasible when the task may run there (its
// allowed_sites, a pinned or avoided site, not drained, remote sites for built-in kinds
// only) and it has a free worker that is not kept for a recovering attempt; preferred
// sites in good standing come first, then the best score: declared speed x observed
// speed / (1 + recent failures and moves) / (1 + 0.1 cost), less for a busier site. A site
// running the task at under half its speed takes it only when no allowed site runs it well.
// The baseline places by declared speed and cost only (as an engine without Diaspora).
//
// Thread safety: the runner thread. Pure decisions on the store's and the sites' state.
#pragma once

#include <string>

#include "context.hpp"
#include "model.hpp"
#include "sites.hpp"
#include "store.hpp"

namespace diaspora::runner {

class Placement {
 public:
  Placement(const Context& ctx, Sites& sites, const InstanceStore& store) : ctx_(ctx), sites_(sites), store_(store) {}

  struct Choice {
    Site* site = nullptr;
    Slot* slot = nullptr;
    explicit operator bool() const { return slot != nullptr; }
  };
  /// The site and free slot for attempt `a` of `inst` at time t; none when no feasible
  /// site has a free worker now (the attempt waits).
  Choice choose(const Instance& inst, const Attempt& a, double t) const;

  /// May attempt `a` of a `task` instance run on `s` (before asking for a free worker)?
  bool feasible(const Site& s, const TaskSpec& task, const Attempt& a) const;
  /// The site's score for `task` at time t (higher is better).
  double score(const Site& s, const std::string& task, double t) const;
  /// The observed speed placement uses (Sites::speed; 1 for the baseline).
  double speed(const Site& s, const std::string& task, double t) const;

 private:
  Slot* free_slot(Site& s, bool first_attempt) const;

  const Context& ctx_;
  Sites& sites_;
  const InstanceStore& store_;
};

}  // namespace diaspora::runner
