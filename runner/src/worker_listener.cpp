// The runner's TCP listener for remote workers and the address a peer reaches this host
// on (remote.hpp).
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

namespace diaspora::runner {

namespace fs = std::filesystem;
namespace json = boost::json;

// ---- listener --------------------------------------------------------------------------------

WorkerListener::WorkerListener(const std::string& bind_host) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw Error("socket: " + storage::errno_text(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, bind_host.c_str(), &a.sin_addr) != 1) throw Error("not an IPv4 address: " + bind_host);
  socklen_t len = sizeof a;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string e = storage::errno_text(errno);
    ::close(fd_);
    throw Error("cannot listen for remote workers on " + bind_host + ": " + e);
  }
  address_ = bind_host + ":" + std::to_string(ntohs(a.sin_port));
}

WorkerListener::~WorkerListener() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<int> WorkerListener::fds() const {
  std::vector<int> v{fd_};
  for (const auto& p : pending_) v.push_back(p.ch.fd());
  return v;
}

std::vector<Hello> WorkerListener::service() {
  for (;;) {
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) break;
    const int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pending_.push_back({LineChannel(c), monotonic_s()});
  }
  std::vector<Hello> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const bool open = it->ch.fill();
    std::optional<json::object> m = it->ch.next();
    if (m) {
      Hello h;
      auto str = [&](const char* k) {
        const json::value* v = m->if_contains(k);
        return v && v->is_string() ? std::string(v->get_string()) : std::string();
      };
      auto num = [&](const char* k) -> pid_t {
        const json::value* v = m->if_contains(k);
        return v && v->is_int64() ? static_cast<pid_t>(v->get_int64()) : -1;
      };
      if (str("op") == "hello" && !str("key").empty()) {
        h.key = str("key");
        h.host = str("host");
        h.pid = num("pid");
        h.engine_pid = num("engine_pid");
        h.ch = std::move(it->ch);
        out.push_back(std::move(h));
      } else {
        it->ch.close();  // not one of ours
      }
      it = pending_.erase(it);
    } else if (!open || monotonic_s() - it->since > 10) {
      it->ch.close();
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  if (s >= 0 && ::connect(s, res->ai_addr, res->ai_addrlen) == 0 && ::getsockname(s, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
    char b[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &me.sin_addr, b, sizeof b)) out = b;
  }
  if (s >= 0) ::close(s);
  ::freeaddrinfo(res);
  return out;
}
}  // namespace diaspora::runner
