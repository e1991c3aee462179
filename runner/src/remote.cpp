// What the remote sites' parts share: the launcher factory, this host's name, the time
// and address helpers. The parts: dask_launcher.cpp, slurm_launcher.cpp,
// worker_listener.cpp (the runner's side of the connection), remote_worker.cpp (the
// one-shot worker's side).
#include "remote.hpp"

#include <unistd.h>

#include <chrono>
#include <fstream>

#include "diaspora/error.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::pair<std::string, std::string> split_host_port(const std::string& a) {
  const auto c = a.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == a.size()) throw Error("'" + a + "' is not HOST:PORT");
  return {a.substr(0, c), a.substr(c + 1)};
}

std::string last_line(const fs::path& file) {
  std::ifstream f(file);
  std::string line, last;
  while (std::getline(f, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last.substr(0, 400);
}

std::string host_name() {
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

std::unique_ptr<Launcher> make_launcher(const SiteSpec& site, const LaunchContext& ctx) {
  if (site.engine == Engine::dask || site.engine == Engine::parsl) return make_bridge_launcher(site, ctx);
  if (site.engine == Engine::slurm) return make_slurm_launcher(site, ctx);
  throw Error("site '" + site.name + "': `diaspora run` drives local, dask, parsl and slurm sites, not " +
              std::string(to_string(site.engine)));
}
}  // namespace diaspora::runner
