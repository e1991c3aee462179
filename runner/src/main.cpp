// diaspora-run: `diaspora run SPEC` (the CLI execs this program). Exit status: 0 every
// task instance succeeded, 1 some failed for good (or the run was interrupted), 2 usage
// and spec errors (reported before anything starts).
//
// Internal mode: `diaspora-run __worker SITE N` is a local site's worker process, started
// by the runner with its channel on fd 3 (worker.hpp); `diaspora-run __worker --connect
// HOST:PORT --key KEY` is a Dask or Slurm site's one-shot worker (remote.hpp).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <ctime>
#include <iostream>

#include "diaspora/error.hpp"
#include "diaspora/runner.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/version.hpp"
#include "embedded_relay.hpp"
#include "remote.hpp"
#include "worker.hpp"

namespace {

/// `diaspora run --serve DIR`: the relay of a run that has ended (or was killed) serves its
/// log and the console again, until SIGINT/SIGTERM. Returns the exit status.
int serve_run(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path relay_dir = dir / "relay", data = relay_dir / "data";
  if (!fs::is_directory(data) || !fs::exists(relay_dir / "token")) {
    std::cerr << "error: --serve " << dir.string() << ": no embedded relay log in " << data.string()
              << " (the output folder of a run with relay.url: embedded; a run with relay.data_dir kept its log "
                 "there: start diaspora-relay on it)\n";
    return 2;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the relay's threads start: only sigwait sees them
  try {
    diaspora::runner::EmbeddedRelay relay(relay_dir, data, "unused");  // the run's token is kept
    const std::string port = std::to_string(relay.port());
    std::cout << "serving the run in " << dir.string() << " until interrupted (Ctrl-C)\n"
              << "  events:  " << relay.url() << " (topics <workflow>.events, <workflow>.control.*)\n"
              << "  console: https://127.0.0.1:" << port << "/console/ (sign in with the token below; the browser "
              << "must trust the CA, or accept the certificate once)\n"
              << "  token:   " << relay.token_file().string() << "\n"
              << "  CA:      " << relay.ca_file().string() << "\n"
              << "  e.g.:    diaspora tail --url " << relay.url() << " --ca " << relay.ca_file().string()
              << " --token-file " << relay.token_file().string() << " --topic '*' --from earliest --idle 2\n";
    std::cout.flush();
    int sig = 0;
    ::sigwait(&set, &sig);
    std::cout << "stopping\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "__worker" && std::string(argv[2]) == "--connect" && std::string(argv[4]) == "--key")
    return diaspora::runner::remote_worker_main(argv[3], argv[5]);
  if (argc >= 2 && std::string(argv[1]) == "__worker") return diaspora::runner::worker_main(3);

  CLI::App app{"Run a workflow spec: an embedded (or remote) relay, the engine plugin loaded from the spec, "
               "local sites with worker pools, the spec's faults injected and the plugin's actions carried out.\n"
               "Docs: docs/run.md.",
               "diaspora run"};
  app.set_version_flag("--version", std::string("diaspora-run ") + diaspora::version_string);
  std::string spec_file, out_dir, baseline, grace = "10s", resume_dir, serve_dir, learn_from;
  std::vector<std::string> sets;
  bool no_policies = false;
  auto* spec_opt = app.add_option("spec", spec_file, "Workflow spec (YAML)");
  app.add_option("--serve", serve_dir, "Serve the events and the console of the run in DIR (its --out; ended or "
                                       "killed) until interrupted; prints the address, the token and the CA")
      ->excludes(spec_opt);
  app.add_option("--out", out_dir, "Output folder (default runs/<name>-<time>/): report.json, report.html, data/, "
                                   "tasks/, the embedded relay's files");
  app.add_option("--set", sets, "Override a spec value: KEY=VALUE, e.g. tasks.burn.count=8, sites[0].workers=4 "
                                "(repeatable; VALUE is YAML)");
  app.add_option("--resume", resume_dir, "Resume the run in DIR (its --out) whose runner was killed: instances its "
                                         "relay log shows completed are not run again")->excludes("--out");
  app.add_option("--learn-from", learn_from, "Start the policies from what an earlier run of this workflow learned "
                                             "(each task's normal step time per site): its --out folder or its "
                                             "normals.json");
  app.add_flag("--no-policies", no_policies, "Run without the spec's policies (no action is taken)");
  app.add_option("--baseline", baseline, "retry-after=DURATION: no policies; a task is retried only when it exits "
                                         "with an error or after DURATION without heartbeats (Parsl HTEX: 120s)");
  app.add_option("--failure-grace", grace, "How long a failed attempt waits for a policy's restart or migrate before "
                                           "it fails for good")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  if (!serve_dir.empty()) return serve_run(serve_dir);
  if (spec_file.empty()) {
    std::cerr << "error: a spec is required: diaspora run SPEC (or --serve DIR to open a finished run)\n";
    return 2;
  }
  diaspora::runner::RunOptions opt;
  if (!baseline.empty()) {
    const std::string key = "retry-after=";
    auto d = baseline.starts_with(key) ? diaspora::parse_duration(baseline.substr(key.size())) : std::nullopt;
    if (!d || d->count() <= 0) {
      std::cerr << "error: --baseline '" << baseline << "': expected retry-after=DURATION, e.g. retry-after=120s\n";
      return 2;
    }
    opt.baseline_retry_after_s = d->count();
    no_policies = true;
  }
  auto g = diaspora::parse_duration(grace);
  if (!g || g->count() < 0) {
    std::cerr << "error: --failure-grace '" << grace << "': expected a duration such as 10s\n";
    return 2;
  }
  opt.failure_grace_s = g->count();

  std::vector<std::string> errors;
  std::optional<diaspora::runner::SpecInput> in;
  try {
    in = diaspora::runner::load_run_spec(spec_file, sets, no_policies, errors);
  } catch (const diaspora::SpecError& e) {
    for (const auto& d : e.diagnostics()) errors.push_back(d.str());
  }
  if (!in) {
    for (const auto& e : errors) std::cerr << e << "\n";
    std::cerr << errors.size() << (errors.size() == 1 ? " error" : " errors") << "; nothing was started\n";
    return 2;
  }
  if (!learn_from.empty()) {
    try {  // checked now, not at open (where a bad file is only a warning): the user asked for it
      opt.learn_from = diaspora::runner::check_learned_normals(in->spec, learn_from);
    } catch (const std::exception& e) {
      std::cerr << "error: --learn-from " << learn_from << ": " << e.what()
                << " (give the --out folder of an earlier run of this workflow, or its normals.json)\n";
      return 2;
    }
  }
  if (!resume_dir.empty()) {
    if (!std::filesystem::is_directory(std::filesystem::path(resume_dir) / "spool")) {
      std::cerr << "error: --resume " << resume_dir << ": not the output folder of a run (no spool/ in it)\n";
      return 2;
    }
    out_dir = resume_dir;
    opt.resume = true;
  }
  if (out_dir.empty()) {
    char stamp[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
    out_dir = "runs/" + in->spec.name + "-" + stamp;
  }
  opt.out_dir = std::filesystem::absolute(out_dir);
  opt.live_view = ::isatty(1) != 0;
  diaspora::runner::install_signal_handlers();
  try {
    return diaspora::runner::run_workflow(*in, opt, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
