// The one-shot remote worker's side: connect to the runner, say hello, then serve the
// local workers' protocol on the connection (remote.hpp, worker.hpp).
#include "remote.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"
#include "worker.hpp"

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

int remote_worker_main(const std::string& address, const std::string& key) {
  std::pair<std::string, std::string> hp;
  try {
    hp = split_host_port(address);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diaspora-run __worker: %s\n", e.what());
    return 2;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(hp.first.c_str(), hp.second.c_str(), &hints, &res) != 0 || !res) {
    std::fprintf(stderr, "diaspora-run __worker: cannot resolve %s\n", address.c_str());
    return 2;
  }
  int fd = -1;
  for (addrinfo* r = res; r && fd < 0; r = r->ai_next) {
    fd = ::socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, r->ai_protocol);
    if (fd >= 0 && ::connect(fd, r->ai_addr, r->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    std::fprintf(stderr, "diaspora-run __worker: cannot connect to the runner at %s: %s\n", address.c_str(),
                 storage::errno_text(errno).c_str());
    return 2;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const char* ep = std::getenv("DIASPORA_ENGINE_WORKER_PID");
  json::object hello{{"op", "hello"}, {"key", key}, {"pid", static_cast<std::int64_t>(::getpid())}, {"host", host_name()},
                     {"engine_pid", ep ? std::atoll(ep) : -1}};
  const std::string line = json::serialize(hello) + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 2;
  return worker_main(fd);
}
}  // namespace diaspora::runner
