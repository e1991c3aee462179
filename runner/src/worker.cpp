#include "worker.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "kinds.hpp"
#include "adapters.hpp"

namespace diaspora::runner {

namespace json = boost::json;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// `sleep`: `seconds` of wall time in steps of `step` seconds.
json::object kind_sleep(const json::object& args, TaskContext& ctx) {
  const double total = arg_number(args, "seconds", 1.0), step = arg_number(args, "step", 0.5);
  const long steps = std::max(1L, static_cast<long>(std::ceil(total / step - 1e-9)));
  for (long s = ctx.resume_step(); s < steps; ++s) {
    const auto t0 = Clock::now();
    const double d = std::min(step, total - static_cast<double>(s) * step);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, d)));
    if (!ctx.step_done(s + 1, steps, seconds_since(t0))) return {};
  }
  return {{"slept_s", total}};
}

// `cpu-burn`: `seconds` of CPU time of this thread (so a slowed site really takes longer),
// in steps of `step` CPU seconds.
json::object kind_cpu_burn(const json::object& args, TaskContext& ctx) {
  const double total = arg_number(args, "seconds", 5.0), step = arg_number(args, "step", 0.5);
  const long steps = std::max(1L, static_cast<long>(std::ceil(total / step - 1e-9)));
  volatile double sink = 0;
  for (long s = ctx.resume_step(); s < steps; ++s) {
    const auto t0 = Clock::now();
    const double until = thread_cpu_seconds() + std::min(step, total - static_cast<double>(s) * step);
    double x = 1.0 + static_cast<double>(s);
    while (thread_cpu_seconds() < until)
      for (int i = 0; i < 20000; ++i) x = std::sqrt(x * 1.000001 + 1.0);
    sink = sink + x;
    if (!ctx.step_done(s + 1, steps, seconds_since(t0))) return {};
  }
  return {{"cpu_s", total}};
}

const std::map<std::string, KindFunction>& kinds() {
  static const std::map<std::string, KindFunction> k = {
      {"sleep", kind_sleep}, {"cpu-burn", kind_cpu_burn}, {"ptycho-reconstruct", ptycho_reconstruct}};
  return k;
}

class Worker final : public TaskContext {
 public:
  explicit Worker(int fd) : ch_(fd) {}

  int loop() {
    if (!ch_.send({{"op", "ready"}, {"pid", static_cast<std::int64_t>(::getpid())}})) return 1;
    for (;;) {
      auto msg = wait_message(-1);
      if (!msg) return 0;  // the runner closed the channel
      const std::string op = str(*msg, "op");
      if (op == "run") run(*msg);
      else if (op == "hang") hang();
      // checkpoint / cancel with nothing running: nothing to do
    }
  }

  bool step_done(long step, long steps, double step_time) override {
    step_ = step;
    ch_.send({{"op", "beat"},
              {"step", step},
              {"steps", steps},
              {"progress", steps > 0 ? static_cast<double>(step) / static_cast<double>(steps) : 1.0},
              {"step_time", step_time}});
    while (auto msg = wait_message(0)) {
      const std::string op = str(*msg, "op");
      if (op == "hang") hang();
      if (op == "cancel") return false;
      if (op == "checkpoint") checkpoint();
    }
    return true;
  }
  long resume_step() const override { return resume_step_; }
  const std::string& data_dir() const override { return data_dir_; }
  const std::string& instance() const override { return id_; }

 private:
  static std::string str(const json::object& o, const char* k) {
    const json::value* v = o.if_contains(k);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
  }

  // The next message, waiting up to timeout_ms (-1: forever); nullopt on timeout or when
  // the runner is gone (then `gone_`).
  std::optional<json::object> wait_message(int timeout_ms) {
    for (;;) {
      if (auto m = ch_.next()) return m;
      if (gone_) return std::nullopt;
      pollfd p{ch_.fd(), POLLIN, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r == 0) return std::nullopt;
      if (r < 0 && errno == EINTR) continue;
      if (!ch_.fill()) gone_ = true;
    }
  }

  [[noreturn]] void hang() {
    for (;;) ::pause();  // no work, no heartbeat, no exit: until the runner kills us
  }

  void checkpoint() {
    if (checkpoint_.empty()) return;
    json::object c{{"id", id_}, {"step", step_}};
    write_file_atomic(checkpoint_, json::serialize(c) + "\n", 0644, Durability::file);
    ch_.send({{"op", "checkpointed"}, {"step", step_}});
  }

  void run(const json::object& msg) {
    id_ = str(msg, "id");
    data_dir_ = str(msg, "data_dir");
    checkpoint_ = str(msg, "checkpoint");
    const json::value* rs = msg.if_contains("resume_step");
    resume_step_ = rs && rs->is_int64() ? rs->get_int64() : 0;
    step_ = resume_step_;
    const std::string kind = str(msg, "kind");
    const json::value* a = msg.if_contains("args");
    const json::object args = a && a->is_object() ? a->get_object() : json::object{};
    const json::value* mem = msg.if_contains("memory");
    rlimit old{};
    ::getrlimit(RLIMIT_AS, &old);
    if (mem && mem->is_int64() && mem->get_int64() > 0) {
      rlimit lim = old;
      lim.rlim_cur = static_cast<rlim_t>(current_vm_bytes() + static_cast<std::uint64_t>(mem->get_int64()));
      if (old.rlim_max != RLIM_INFINITY) lim.rlim_cur = std::min(lim.rlim_cur, old.rlim_max);
      ::setrlimit(RLIMIT_AS, &lim);
    }
    json::object reply;
    try {
      const KindFunction* f = find_kind(kind);
      if (!f) throw Error("unknown built-in kind '" + kind + "'");
      if (!data_dir_.empty()) std::filesystem::create_directories(data_dir_);
      json::object result = (*f)(args, *this);
      if (resume_step_ > 0) result["resumed_from_step"] = resume_step_;
      reply = {{"op", "done"}, {"result", std::move(result)}};
    } catch (const std::bad_alloc&) {
      reply = {{"op", "failed"}, {"reason", "out of memory (resources.memory limit)"}};
    } catch (const std::exception& e) {
      reply = {{"op", "failed"}, {"reason", e.what()}};
    }
    ::setrlimit(RLIMIT_AS, &old);
    ch_.send(reply);
  }

  static std::uint64_t current_vm_bytes() {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
      if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  }

  LineChannel ch_;
  bool gone_ = false;
  std::string id_, data_dir_, checkpoint_;
  long resume_step_ = 0, step_ = 0;
};

}  // namespace

const KindFunction* find_kind(const std::string& name) {
  auto it = kinds().find(name);
  return it == kinds().end() ? nullptr : &it->second;
}

int worker_main(int fd) {
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);  // the runner decides when its workers stop (a terminal's ^C reaches the group)
  Worker w(fd);
  return w.loop();
}

}  // namespace diaspora::runner
