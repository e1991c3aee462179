// diaspora-train: the command line of the continual-learning trainer (docs/rehearsal.md).
//
//   diaspora-train [--config F] --out DIR [--set key=value ...]
//                  [--world-size N | --rank R --world-size N --master HOST:PORT]
//                  [--resume DIR | --resume-item URI] [--stop-after STEPS] [--checkpoint-delay-ms MS] [--rank-grace-ms MS]
//
// --world-size N alone spawns N local ranks (this binary again, with --rank/--master on a
// free loopback port) and waits for them; SIGTERM/SIGINT are forwarded to the ranks,
// which checkpoint and exit 3 (SIGUSR1 too: they checkpoint and go on). Exit statuses: see TrainExit in diaspora/trainer.hpp.
#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "diaspora/signal_pipe.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/trainer.hpp"

namespace dr = diaspora::rehearsal;

namespace {

std::atomic<int> g_stop{0};
std::atomic<int> g_checkpoint{0};
constexpr int kMaxRanks = 1024;  // --world-size's bound
std::atomic<pid_t> g_children[kMaxRanks];  // the spawned ranks, read by the signal hook

// In the handler (core's signal pipe): flags the trainer polls, and the signal passed on to
// the local ranks (async-signal-safe: atomics and kill only).
void on_signal(int sig, int) {
  (sig == SIGUSR1 ? g_checkpoint : g_stop).store(1);
  for (const auto& c : g_children)
    if (const pid_t p = c.load(); p > 0) ::kill(p, sig == SIGINT ? SIGTERM : sig);
}

// TERM and INT stop at a checkpoint, USR1 checkpoints now and goes on. SIGPIPE is ignored
// (install_signal_pipe): a closed progress channel (DIASPORA_PROGRESS_FD: diaspora run died)
// must not kill a rank on its way to the stop checkpoint; the write fails with EPIPE instead.
void install_handlers() { diaspora::install_signal_pipe({SIGTERM, SIGINT, SIGUSR1}, on_signal); }

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// Runs `argv` once per rank with --rank/--master appended; returns the job's status: 0 if
// every rank returned 0, else the first non-zero status in rank order (a rank that dies
// of a signal counts as kTrainError, and the others are killed if they have not ended
// `grace_period` later).
int spawn_ranks(int world, const std::vector<std::string>& args, std::chrono::milliseconds grace_period) {
  const int port = free_loopback_port();
  if (port < 0) {
    dr::print_line("no free loopback port for the rendezvous");
    return dr::kTrainError;
  }
  const std::string master = "127.0.0.1:" + std::to_string(port);
  std::vector<int> status(static_cast<std::size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--rank", std::to_string(r), "--world-size", std::to_string(world), "--master", master});
    std::vector<char*> cargv;
    for (auto& s : a) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
      dr::print_line(std::string("fork: ") + std::strerror(errno));
      for (int q = 0; q < r; ++q) ::kill(g_children[q].load(), SIGKILL);
      return dr::kTrainError;
    }
    if (pid == 0) {
      ::execv("/proc/self/exe", cargv.data());
      std::perror("diaspora-train: exec");
      ::_exit(dr::kTrainError);
    }
    g_children[r].store(pid);
  }
  // A failed rank can leave the others waiting in a collective: they get a grace period
  // to fail on their own (and say why), then are killed.
  bool grace = false;  // someone failed: waiting until kill_at for the others
  std::chrono::steady_clock::time_point kill_at{};
  int left = world;
  while (left > 0) {
    int st = 0;
    pid_t p = ::waitpid(-1, &st, grace ? WNOHANG : 0);
    if (p == 0) {  // someone failed, the others are still running
      if (std::chrono::steady_clock::now() >= kill_at) {
        for (int q = 0; q < world; ++q)
          if (status[static_cast<std::size_t>(q)] < 0) ::kill(g_children[q].load(), SIGKILL);
        grace = false;  // now wait for them to go
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int r = 0; r < world; ++r) {
      if (g_children[r].load() != p) continue;
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : dr::kTrainError;
      status[static_cast<std::size_t>(r)] = code;
      --left;
      if (code == dr::kTrainError) {
        if (!WIFEXITED(st)) dr::print_line("rank " + std::to_string(r) + " died of signal " + std::to_string(WTERMSIG(st)));
        if (!grace && left > 0) {
          grace = true;
          kill_at = std::chrono::steady_clock::now() + grace_period;
        }
      }
    }
  }
  for (int s : status)
    if (s != 0) return s;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"diaspora-train: continual learning with a distributed rehearsal buffer (docs/rehearsal.md)"};
  std::string config, out, master, resume, resume_item;
  std::vector<std::string> sets;
  int world = 1, rank = -1;
  std::int64_t stop_after = 0;
  int checkpoint_delay_ms = 0;
  int rank_grace_ms = 3000;
  app.add_option("--config", config, "trainer config (YAML; schemas/rehearsal.schema.json; default: the built-in defaults)");
  app.add_option("--out", out, "output directory: metrics.jsonl, summary.json, curves.png, checkpoint/")->required();
  app.add_option("--set", sets, "override a config key, e.g. --set strategy=er --set train.epochs=2");
  app.add_option("--world-size", world, "number of ranks (alone: spawn them here)")->check(CLI::Range(1, 1024));
  app.add_option("--rank", rank, "this process's rank (with --world-size and --master)")->check(CLI::Range(0, 1023));
  app.add_option("--master", master, "HOST:PORT of rank 0's rendezvous store");
  app.add_option("--resume", resume, "continue from the checkpoint in this directory (a previous --out, or its checkpoint/)");
  app.add_option("--resume-item", resume_item,
                 "continue from the checkpoint a job put at this diaspora://TOPIC/OFFSET (checkpoint.item_topic), "
                 "fetched from checkpoint.relay into the checkpoint folder first");
  app.add_option("--stop-after", stop_after, "checkpoint and exit 3 after this many steps (drills and tests)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 60));
  app.add_option("--checkpoint-delay-ms", checkpoint_delay_ms,
                 "delay each background checkpoint write by this much (drills and tests)")
      ->check(CLI::Range(0, 600000));
  app.add_option("--rank-grace-ms", rank_grace_ms,
                 "with spawned ranks: after one fails, how long the others may take to end on their own "
                 "before they are killed (default 3000)")
      ->check(CLI::Range(0, 3600000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : dr::kTrainUsage;
  }
  if (rank >= world) {
    std::cerr << "diaspora-train: --rank " << rank << " must be below --world-size " << world << "\n";
    return dr::kTrainUsage;
  }
  if (rank >= 0 && world > 1 && master.empty()) {
    std::cerr << "diaspora-train: --rank needs --master HOST:PORT (or give --world-size alone to spawn local ranks)\n";
    return dr::kTrainUsage;
  }
  if (!master.empty()) {
    try {
      dr::parse_master_address(master);
    } catch (const diaspora::Error& e) {
      std::cerr << "diaspora-train: " << e.what() << "\n";
      return dr::kTrainUsage;
    }
  }
  dr::TrainerConfig cfg;
  try {
    cfg = config.empty() ? dr::load_trainer_config_string("{}", "<defaults>", sets)
                         : dr::load_trainer_config_file(config, sets);
  } catch (const diaspora::SpecError& e) {
    std::cerr << e.what() << "\n";
    return dr::kTrainError;
  }
  if (!resume_item.empty()) {  // fetched once, here; the ranks then --resume from the folder
    if (!resume.empty() || rank >= 0) {
      std::cerr << "diaspora-train: --resume-item goes alone (not with --resume), to the job's first process (not "
                   "with --rank)\n";
      return dr::kTrainUsage;
    }
    const std::filesystem::path root =
        cfg.checkpoint_dir.empty() ? std::filesystem::path(out) / "checkpoint" : std::filesystem::path(cfg.checkpoint_dir);
    try {
      resume = dr::fetch_checkpoint_item(cfg, resume_item, root).string();
    } catch (const std::exception& e) {  // RehearsalError, or the folder cannot be made
      dr::print_line(e.what());
      return dr::kTrainError;
    }
    dr::print_line("fetched the checkpoint at " + resume_item + " into " + resume);
  }
  install_handlers();
  if (rank < 0 && world > 1) {
    std::vector<std::string> args(argv, argv + argc);
    std::vector<std::string> keep;
    for (std::size_t i = 0; i < args.size(); ++i) {  // drop --world-size N; spawn_ranks adds it back
      if (args[i] == "--world-size") {
        ++i;
        continue;
      }
      if (args[i] == "--resume-item") {  // fetched above: the ranks resume from the folder
        ++i;
        continue;
      }
      if (args[i].rfind("--world-size=", 0) == 0 || args[i].rfind("--resume-item=", 0) == 0) continue;
      keep.push_back(args[i]);
    }
    if (!resume_item.empty()) keep.insert(keep.end(), {"--resume", resume});
    return spawn_ranks(world, keep, std::chrono::milliseconds(rank_grace_ms));
  }
  dr::RankOptions o;
  o.out = out;
  o.rank = rank < 0 ? 0 : rank;
  o.world = world;
  o.master = master.empty() ? "127.0.0.1:0" : master;
  if (!resume.empty()) o.resume = resume;
  o.stop_after = stop_after;
  o.checkpoint_delay_ms = checkpoint_delay_ms;
  o.progress_bar = o.rank == 0 && ::isatty(2);
  o.stop_flag = &g_stop;
  o.checkpoint_flag = &g_checkpoint;
  return dr::run_trainer(cfg, o);
}
