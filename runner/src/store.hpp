// The instance/attempt store: every task instance of the run, its attempts, the queue of
// attempts waiting for a worker and the instances waiting for the policies' decision. The
// only owner of this state; the other parts change it through these functions or through
// the references it hands out (valid until the next add()).
//
// Thread safety: the runner thread.
#pragma once

#include <deque>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model.hpp"
#include "resume.hpp"

namespace diaspora::runner {

class InstanceStore {
 public:
  /// (instance, attempt) indices.
  using Ref = std::pair<int, int>;

  /// What the run this one resumes did (--resume): its completed instances are restored,
  /// its attempt numbers continued.
  void set_prior(PriorRun prior) { prior_ = std::move(prior); }
  const PriorRun& prior() const { return prior_; }

  /// Adds an instance. When the run this one resumes completed it, it is kept as completed
  /// (restored) and add() returns -1; else it is open and add() returns its index.
  int add(Instance inst);

  std::vector<Instance>& all() { return insts_; }
  const std::vector<Instance>& all() const { return insts_; }
  Instance& at(int ii) { return insts_[static_cast<std::size_t>(ii)]; }
  const Instance& at(int ii) const { return insts_[static_cast<std::size_t>(ii)]; }
  Attempt& attempt(int ii, int ai) { return at(ii).attempts[static_cast<std::size_t>(ai)]; }
  const Attempt& attempt(int ii, int ai) const { return at(ii).attempts[static_cast<std::size_t>(ai)]; }
  int size() const { return static_cast<int>(insts_.size()); }

  /// The instance a hook id names ("burn.3" or "burn.3@copy1"), -1 when none; its latest
  /// attempt with that hook id in *attempt_out (-1 when none).
  int find(const std::string& hook_id, int* attempt_out) const;
  /// The instance with this id, -1 when none.
  int index_of(const std::string& id) const;

  /// Appends `a` to instance ii, numbered after its hook id's earlier attempts (this run's
  /// and the resumed run's), queued at time `t`. Recovering attempts (restarts, migrations,
  /// copies) go before first attempts in the queue: the work already late comes first.
  /// A non-speculative attempt makes the instance pending again. Returns its index.
  int queue_attempt(int ii, Attempt a, double t);
  /// The attempts waiting for a worker, in the order they are placed.
  std::deque<Ref>& queue() { return queue_; }
  const std::deque<Ref>& queue() const { return queue_; }

  /// The instance failed and waits for the policies' restart or migrate (since `t`).
  void await(int ii, double t);
  /// It no longer waits (an attempt was queued or started, or it ended).
  void stop_waiting(int ii) { awaiting_.erase(ii); }
  const std::set<int>& awaiting() const { return awaiting_; }
  /// Instances waiting for the policies whose last attempt ran on `site`: a worker there is
  /// kept for their recovering attempt.
  long reserved(const std::string& site) const;

  /// Makes instance ii final with `st` at `t`; its queued attempts are cancelled. False (and
  /// nothing changes) when it was final already.
  bool finish(int ii, InstanceState st, const std::string& reason, double t);
  /// Instances not final.
  long open() const { return open_; }

 private:
  std::vector<Instance> insts_;
  std::unordered_map<std::string, int> index_;  ///< instance id -> index in insts_
  std::set<int> awaiting_;
  std::deque<Ref> queue_;
  long open_ = 0;
  PriorRun prior_;
};

}  // namespace diaspora::runner
