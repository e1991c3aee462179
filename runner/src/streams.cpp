#include "streams.hpp"

#include <algorithm>

namespace diaspora::runner {

void Streams::start(const InstanceStore& store) {
  for (std::size_t t = 0; t < ctx_.spec.tasks.size(); ++t) {
    const TaskSpec& ts = ctx_.task(t);
    if (!ts.rate) {
      for (long k = 0; k < ts.count; ++k) lifecycle_.submit_instance(t, k);
      continue;
    }
    Stream st;
    st.task = t;
    st.rate = *ts.rate;
    st.end_t = ts.duration ? ts.duration->count() : 60.0;
    st.total = instances_of(ts);
    // Resumed: the instances the earlier run submitted are restored or submitted again
    // now; the stream goes on from the next one at its rate.
    if (auto it = store.prior().submitted.find(ts.name); it != store.prior().submitted.end()) {
      const long upto = std::min(it->second + 1, st.total);
      for (long k = 0; k < upto; ++k) lifecycle_.submit_instance(t, k);
      st.end_t = std::max(0.0, st.end_t - static_cast<double>(upto) / st.rate);
      st.total -= upto;
      st.first_index = upto;
    }
    streams_.push_back(st);
  }
}

void Streams::tick() {
  if (ctx_.stopping) return;
  const double t = ctx_.now();
  if (throttle_ < 1 && t >= throttle_until_) {
    throttle_ = 1;
    ctx_.say("throttle over: new instances at the full rate again");
  }
  for (auto& st : streams_)
    while (st.created < st.total && t >= st.next_t) {
      lifecycle_.submit_instance(st.task, st.first_index + st.created);
      ++st.created;
      st.next_t += 1.0 / (st.rate * throttle_);
    }
}

double Streams::throttle() {
  throttle_ = std::max(1.0 / 16, throttle_ * 0.5);
  throttle_until_ = ctx_.now() + 60;
  return throttle_;
}

bool Streams::open() const {
  if (ctx_.stopping) return false;
  for (const auto& st : streams_)
    if (st.created < st.total) return true;
  return false;
}

double Streams::next_due(double cap) const {
  double next = cap;
  for (const auto& st : streams_)
    if (st.created < st.total) next = std::min(next, std::max(0.0, st.next_t - ctx_.now()));
  return next;
}

bool Streams::making(const std::string& task_name) const {
  for (const auto& st : streams_)
    if (ctx_.task(st.task).name == task_name && st.created < st.total) return true;
  return false;
}

}  // namespace diaspora::runner
