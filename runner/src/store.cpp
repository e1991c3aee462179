#include "store.hpp"

#include <algorithm>

namespace diaspora::runner {

int InstanceStore::add(Instance inst) {
  const bool restored = prior_.completed.count(inst.id) > 0;
  if (restored) {
    inst.state = InstanceState::completed;
    inst.restored = true;
    inst.reason = "completed in the run this one resumes";
  }
  insts_.push_back(std::move(inst));
  const int ii = static_cast<int>(insts_.size()) - 1;
  index_[insts_.back().id] = ii;
  if (restored) return -1;
  ++open_;
  return ii;
}

int InstanceStore::find(const std::string& hook_id, int* attempt_out) const {
  const int ii = index_of(hook_id.substr(0, hook_id.find('@')));
  int best = -1;
  if (ii >= 0) {
    const Instance& inst = at(ii);
    for (std::size_t k = 0; k < inst.attempts.size(); ++k)
      if (inst.attempts[k].hook_id == hook_id) best = static_cast<int>(k);
  }
  if (attempt_out) *attempt_out = best;
  return ii;
}

int InstanceStore::index_of(const std::string& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second;
}

int InstanceStore::queue_attempt(int ii, Attempt a, double t) {
  Instance& inst = at(ii);
  int n = 0;
  if (auto it = prior_.attempts.find(a.hook_id); it != prior_.attempts.end()) n = it->second;
  for (const auto& x : inst.attempts)
    if (x.hook_id == a.hook_id) n = std::max(n, x.number);
  a.number = n + 1;
  if (a.number > 1 && a.cause == "first attempt") a.cause = "resumed (the run it resumes had " + std::to_string(n) + ")";
  a.queued_t = t;
  a.outcome = Outcome::queued;
  const bool recovering = !a.first();
  if (!a.speculative) {
    inst.state = InstanceState::pending;
    awaiting_.erase(ii);
  }
  inst.attempts.push_back(std::move(a));
  const int ai = static_cast<int>(inst.attempts.size()) - 1;
  if (recovering) {
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Ref& q) { return attempt(q.first, q.second).first(); });
    queue_.insert(it, {ii, ai});
  } else {
    queue_.emplace_back(ii, ai);
  }
  return ai;
}

void InstanceStore::await(int ii, double t) {
  Instance& inst = at(ii);
  inst.state = InstanceState::awaiting;
  inst.awaiting_since = t;
  awaiting_.insert(ii);
}

long InstanceStore::reserved(const std::string& site) const {
  long n = 0;
  for (int ii : awaiting_) {
    const Instance& inst = at(ii);
    if (!inst.attempts.empty() && inst.attempts.back().site == site) ++n;
  }
  return n;
}

bool InstanceStore::finish(int ii, InstanceState st, const std::string& reason, double t) {
  Instance& inst = at(ii);
  if (inst.final()) return false;
  inst.state = st;
  awaiting_.erase(ii);
  --open_;
  inst.end_t = t;
  inst.reason = reason;
  for (auto& a : inst.attempts)
    if (a.queued()) {
      a.outcome = Outcome::cancelled;
      a.reason = "the instance " + std::string(to_string(st));
      a.end_t = t;
    }
  return true;
}

}  // namespace diaspora::runner
