#include "workers.hpp"

#include <poll.h>
#include <unistd.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <tuple>

#include "diaspora/files.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

Workers::Workers(Context& ctx, InstanceStore& store, Sites& sites, Lifecycle& lifecycle, ActionLog& actions, RehearsalJobs& jobs)
    : ctx_(ctx), store_(store), sites_(sites), lifecycle_(lifecycle), actions_(actions),
      local_(ctx, store, sites, lifecycle, actions, jobs), remote_(ctx, store, sites, lifecycle, actions) {
  remote_.on_connect = [this](Site& s, Slot& slot) { read(s, slot); };
}

void Workers::start_sites(const json::value& document) {
  for (auto& s : sites_.all())
    if (s.spec->engine == Engine::local)
      for (auto& slot : s.slots) local_.spawn_worker(s, slot);
  remote_.start(document);
  std::string what;
  for (auto& s : sites_.all())
    what += (what.empty() ? "" : ", ") + s.name() + " (" + std::to_string(s.slots.size()) + " workers" +
            (s.remote() ? ", " + s.launcher->describe() : "") + ")";
  const std::string address = remote_.address();
  ctx_.say("sites: " + what + (address.empty() ? "" : "; remote workers connect to " + address));
}

void Workers::wait_ready(double timeout_s, std::span<const int> wake_fds) {
  const double until = ctx_.now() + timeout_s;
  for (;;) {
    bool all = true;
    for (auto& s : sites_.all())
      for (auto& slot : s.slots) all &= slot.ready;
    if (all || ctx_.now() > until) return;
    poll(0.05, wake_fds);
  }
}

json::object Workers::run_message(int ii, int ai) const {
  const Instance& inst = store_.at(ii);
  const Attempt& a = store_.attempt(ii, ai);
  const TaskSpec& ts = ctx_.task(inst.task);
  const fs::path ckpt = ctx_.ckpt_dir / (inst.id + ".json");
  long resume = 0;
  if (fs::exists(ckpt)) {
    try {
      const json::value c = json::parse(read_file(ckpt));
      if (c.is_object() && c.get_object().contains("step") && c.get_object().at("step").is_int64())
        resume = static_cast<long>(c.get_object().at("step").get_int64());
    } catch (const std::exception&) {
      resume = 0;  // an unreadable checkpoint: start over
    }
  }
  json::object args;
  for (const auto& [k, v] : ts.args) args[k] = v;
  return {{"op", "run"},
          {"id", inst.id},
          {"attempt", a.number},
          {"kind", *ts.kind},
          {"args", args},
          {"memory", static_cast<std::int64_t>(ts.resources.memory)},
          {"data_dir", (ctx_.data_dir / ts.name).string()},
          {"checkpoint", ckpt.string()},
          {"resume_step", static_cast<std::int64_t>(resume)}};
}

bool Workers::start(int ii, int ai, Site& s, Slot& slot) {
  const TaskSpec& ts = ctx_.task(store_.at(ii).task);
  if (!ts.kind) return local_.start_command(ii, ai, s, slot);
  if (s.remote()) return remote_.launch(ii, ai, s, slot, run_message(ii, ai));
  return local_.start_kind(ii, ai, s, slot, run_message(ii, ai));
}

void Workers::stop(Site& s, Slot& slot) {
  if (s.remote()) remote_.stop(s, slot);
  else local_.stop(s, slot);
}

void Workers::pause(Site& s, Slot& slot, bool paused) {
  if (s.remote()) remote_.pause(s, slot, paused);
  else local_.pause(s, slot, paused);
}

std::string Workers::kill_worker(Site& s, Slot& slot) {
  return s.remote() ? remote_.kill_worker(s, slot) : local_.kill_worker(s, slot);
}

// A remote worker has no command of its own: hang and checkpoint go over its connection,
// as to a local worker.
void Workers::hang(Site& s, Slot& slot) { local_.hang(s, slot); }

bool Workers::request_checkpoint(Site& s, Slot& slot) { return local_.request_checkpoint(s, slot); }

void Workers::on_message(Site& s, Slot& slot, const json::object& m) {
  const json::value* opv = m.if_contains("op");
  const std::string op = opv && opv->is_string() ? std::string(opv->get_string()) : "";
  if (op == "ready") {
    slot.ready = true;
    if (s.remote()) remote_.on_ready(s, slot);  // a remote attempt begins
    return;
  }
  if (op == "checkpointed") {
    const std::string id = std::exchange(slot.pending_checkpoint, "");
    const json::value* st = m.if_contains("step");
    actions_.acknowledge(id, true, "checkpoint written at step " + (st ? json::serialize(*st) : std::string("?")));
    return;
  }
  if (slot.inst < 0) return;  // a late message of an attempt that was stopped
  const int ii = slot.inst, ai = slot.att;
  Instance& inst = store_.at(ii);
  Attempt& a = store_.attempt(ii, ai);
  if (op == "beat") {
    a.last_beat = ctx_.now();
    auto num = [&](const char* k) {
      const json::value* v = m.if_contains(k);
      return v && v->is_number() ? v->to_number<double>() : 0.0;
    };
    a.step = static_cast<long>(num("step"));
    if (const double st = num("step_time"); st > 0) Sites::observe_step_time(s, ctx_.task(inst.task).name, st, ctx_.now());
    a.progress = std::clamp(num("progress"), 0.0, 1.0);
    const diaspora_metric_value step_time{"step_time_s", num("step_time")};  // one a beat: no allocation
    ctx_.hooks.task_progress(a, a.progress, a.step, {&step_time, 1});
  } else if (op == "done" || op == "failed") {
    if (s.remote()) remote_.release(s, slot);  // a one-shot worker: it exits when the channel closes
    slot.inst = slot.att = -1;
    // A checkpoint asked for while the last step ran: the worker ended without reading it
    // (with nothing running it ignores one), so it is answered here, not left pending.
    if (!slot.pending_checkpoint.empty())
      actions_.acknowledge(std::exchange(slot.pending_checkpoint, ""), false,
                           std::string("the attempt ") + (op == "done" ? "completed" : "failed") +
                               " before it wrote the checkpoint");
    if (op == "done") {
      if (const json::value* r = m.if_contains("result"); r && r->is_object() && inst.state != InstanceState::completed)
        inst.result = r->get_object();
      lifecycle_.ended(ii, ai, true, "");
    } else {
      const json::value* r = m.if_contains("reason");
      lifecycle_.ended(ii, ai, false, r && r->is_string() ? std::string(r->get_string()) : "failed", false, std::nullopt,
                       true);  // the built-in kind's own error
    }
  }
}

// The messages buffered on the slot's channel.
void Workers::read(Site& s, Slot& slot) {
  while (slot.ch.fd() >= 0)
    if (auto m = slot.ch.next()) on_message(s, slot, *m);
    else break;
}

void Workers::poll(double timeout_s, std::span<const int> wake_fds) {
  std::vector<pollfd> fds;
  std::vector<std::tuple<Site*, Slot*, bool>> who;  // bool: command progress pipe
  for (int fd : wake_fds) {
    fds.push_back({fd, POLLIN, 0});  // poll() leaves a negative fd out
    who.emplace_back(nullptr, nullptr, false);
  }
  for (int fd : remote_.fds()) {
    fds.push_back({fd, POLLIN, 0});
    who.emplace_back(nullptr, nullptr, false);
  }
  for (auto& s : sites_.all())
    for (auto& slot : s.slots) {
      if (slot.ch.fd() >= 0) {
        fds.push_back({slot.ch.fd(), POLLIN, 0});
        who.emplace_back(&s, &slot, false);
      }
      if (slot.progress.fd() >= 0) {
        fds.push_back({slot.progress.fd(), POLLIN, 0});
        who.emplace_back(&s, &slot, true);
      }
    }
  const int ms = std::clamp(static_cast<int>(timeout_s * 1000), 0, 100);
  if (::poll(fds.data(), fds.size(), ms) > 0) {
    for (std::size_t k = 0; k < wake_fds.size(); ++k)
      if (fds[k].revents) {
        char buf[256];
        while (::read(wake_fds[k], buf, sizeof buf) > 0) {
        }
      }
    for (std::size_t k = wake_fds.size(); k < fds.size(); ++k) {  // after the wake fds (drained above)
      if (!fds[k].revents) continue;
      auto [s, slot, cmd] = who[k];
      if (!slot) continue;  // the listener's: served below
      if (cmd) {
        const bool open = slot->progress.fill();
        while (auto line = slot->progress.next_line()) local_.on_command_line(*slot, *line);
        if (!open) slot->progress.close();
        continue;
      }
      const bool open = slot->ch.fill();
      read(*s, *slot);
      if (!open && s->remote()) remote_.lost(*s, *slot, "its connection closed");
      else if (!open) slot->ch.close();  // the worker is gone: reap() handles its exit
    }
    remote_.service();
  }
  local_.reap();
}

void Workers::tick() {
  local_.tick();
  remote_.tick();
}

void Workers::shutdown() {
  local_.shutdown();
  remote_.shutdown();
}

}  // namespace diaspora::runner
