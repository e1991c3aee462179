// Relay configuration checks shared by the server and diaspora-relay's main().
// Internal to the relay. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace diaspora::relay {

/// A listen address: a numeric IPv4 or IPv6 host ("localhost" reads as 127.0.0.1) and a port.
struct ListenAddress {
  std::string host;
  std::uint16_t port = 0;
};

/// Parses "HOST:PORT" ("[::1]:7443" for IPv6). Throws RelayConfigError naming --listen and
/// what is wrong.
ListenAddress parse_listen(const std::string& text);

}  // namespace diaspora::relay
