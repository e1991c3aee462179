#include "action_desk.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

namespace diaspora::plugin {

namespace {

constexpr std::pair<std::string_view, int> kActionKinds[] = {
    {"restart", DIASPORA_ACTION_RESTART},     {"migrate", DIASPORA_ACTION_MIGRATE},
    {"speculate", DIASPORA_ACTION_SPECULATE}, {"checkpoint", DIASPORA_ACTION_CHECKPOINT},
    {"throttle", DIASPORA_ACTION_THROTTLE},   {"cancel", DIASPORA_ACTION_CANCEL},
    {"drain", DIASPORA_ACTION_DRAIN},         {"undrain", DIASPORA_ACTION_UNDRAIN}};

template <std::size_t N>
void copy_str(char (&dst)[N], std::string_view s) {
  const std::size_t n = std::min(s.size(), N - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// Fills `out` as far as its struct_size reaches: fields of later minor versions only when
// the caller's struct holds them (an engine built against ABI 1.0 polls with a shorter one).
void fill(diaspora_action& out, const Action& a) {
  copy_str(out.id, a.id);
  out.kind = a.kind;
  copy_str(out.kind_name, a.kind_name);
  copy_str(out.task_id, a.task_id);
  copy_str(out.site, a.site);
  copy_str(out.target_site, a.target_site);
  copy_str(out.reason, a.reason);
  copy_str(out.origin, a.origin);
  out.issued_us = a.issued_us;
  if (out.struct_size >= offsetof(diaspora_action, requested_us) + sizeof out.requested_us)
    out.requested_us = a.requested_us;
}

}  // namespace

int action_kind(std::string_view name) noexcept {
  for (auto [n, kind] : kActionKinds)
    if (name == n) return kind;
  return 0;  // alert: for people, not for the engine
}

void ActionDesk::hand_to_polling_locked() {
  while (!to_deliver_.empty()) {
    poll_queue_.push_back(std::move(to_deliver_.front()));
    to_deliver_.pop_front();
  }
}

int ActionDesk::set_callback(diaspora_action_callback cb, void* user) noexcept {
  std::lock_guard lock(mu_);
  if (!callback_) {
    // Actions that arrived while no callback was installed belong to diaspora_poll_action,
    // even those the control thread has not handed on yet.
    try {
      hand_to_polling_locked();
    } catch (const std::exception&) {  // out of memory: the rest stay for the callback
      return DIASPORA_ERR_INTERNAL;
    }
  }
  callback_ = cb;
  callback_user_ = user;
  cv_.notify_all();
  return DIASPORA_OK;
}

int ActionDesk::poll(diaspora_action* out, std::string& error) noexcept {
  try {
    std::lock_guard lock(mu_);
    if (poll_queue_.empty()) return DIASPORA_ERR_EMPTY;
    Action a = std::move(poll_queue_.front());
    poll_queue_.pop_front();
    fill(*out, a);
    unacked_order_.push_back(a.id);
    unacked_.emplace(a.id, std::move(a));
    return DIASPORA_OK;
  } catch (const std::exception& e) {
    error = std::string("poll: ") + e.what();
    return DIASPORA_ERR_INTERNAL;
  }
}

int ActionDesk::ack(std::string_view id, bool ok, std::string_view message, std::string& error) noexcept {
  try {
    Action a;
    {
      std::lock_guard lock(mu_);
      auto it = unacked_.find(std::string(id));
      if (it == unacked_.end()) {
        error = "action '" + std::string(id) + "' is not waiting for an acknowledgement (unknown, or already acknowledged)";
        return DIASPORA_ERR_NOT_FOUND;
      }
      a = std::move(it->second);
      unacked_.erase(it);
    }
    outcome_(a, ok, message);
    return DIASPORA_OK;
  } catch (const std::exception& e) {
    error = std::string("action ack: ") + e.what();
    return DIASPORA_ERR_INTERNAL;
  }
}

void ActionDesk::submit(Action a) {
  if (a.kind == 0) return;  // alert: published for people, not delivered to the engine
  std::lock_guard lock(mu_);
  to_deliver_.push_back(std::move(a));
  received_.fetch_add(1, std::memory_order_relaxed);
  cv_.notify_all();
}

std::string ActionDesk::submit_request(const events::ActionRequested& req, std::int64_t requested_us) {
  Action a;
  a.kind = action_kind(req.action);
  if (a.kind == 0) return {};  // alert: for people, not for the engine
  auto too_long = [](const std::optional<std::string>& v, std::size_t max) { return v && v->size() > max; };
  if (req.action_id.size() > DIASPORA_MAX_ID || too_long(req.task_id, DIASPORA_MAX_ID) ||
      too_long(req.site, DIASPORA_MAX_ID) || too_long(req.target_site, DIASPORA_MAX_ID) ||
      req.reason.size() > DIASPORA_MAX_TEXT) {
    Action refused;
    refused.id = req.action_id;
    refused.kind_name = req.action;
    refused.task_id = req.task_id.value_or("");
    if (req.action_id.size() <= 256)  // else no valid action.done can name it
      outcome_(refused, false,
               "refused by the plugin: action_id, task_id, site and target_site must be at most 255 bytes, reason at "
               "most 4095");
    return "action '" + req.action_id.substr(0, 64) + "' refused: an id is longer than 255 bytes";
  }
  a.id = req.action_id;
  a.kind_name = req.action;
  a.task_id = req.task_id.value_or("");
  a.site = req.site.value_or("");
  a.target_site = req.target_site.value_or("");
  a.reason = req.reason;
  a.origin = "control";
  a.issued_us = now_us();
  a.requested_us = requested_us;
  submit(std::move(a));
  return {};
}

void ActionDesk::deliver() {
  std::deque<Action> batch;
  diaspora_action_callback cb;
  void* user;
  struct Expired {
    Action action;
    const char* why;
  };
  std::vector<Expired> expired;
  {
    std::lock_guard lock(mu_);
    cb = callback_;
    user = callback_user_;
    if (!cb) {
      hand_to_polling_locked();
      while (poll_queue_.size() > kMaxPollQueue) {
        expired.push_back({std::move(poll_queue_.front()), "the engine did not poll for it (4096 actions waiting)"});
        poll_queue_.pop_front();
      }
    } else {
      batch.swap(to_deliver_);
      for (const auto& a : batch) {
        unacked_order_.push_back(a.id);
        unacked_.emplace(a.id, a);
      }
    }
    while (unacked_.size() > kMaxUnacked && !unacked_order_.empty()) {
      auto it = unacked_.find(unacked_order_.front());
      if (it != unacked_.end()) {
        expired.push_back({std::move(it->second), "never acknowledged by the engine"});
        unacked_.erase(it);
      }
      unacked_order_.pop_front();
    }
    if (unacked_order_.size() > 2 * kMaxUnacked)
      std::erase_if(unacked_order_, [&](const std::string& id) { return !unacked_.contains(id); });
  }
  for (const auto& e : expired) outcome_(e.action, false, e.why);
  if (!cb) return;
  for (const auto& a : batch) {
    auto out = std::make_unique<diaspora_action>();
    std::memset(out.get(), 0, sizeof *out);
    out->struct_size = sizeof *out;
    fill(*out, a);
    cb(out.get(), user);  // a C callback: nothing can be thrown through it
  }
}

void ActionDesk::wait(std::chrono::milliseconds timeout, const std::atomic<bool>& stop) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return stop.load() || (!to_deliver_.empty() && callback_); });
}

void ActionDesk::wake() {
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

}  // namespace diaspora::plugin
