// The plugin's connection for data items (docs/streaming.md, diaspora_item_put/get): a
// relay session of its own, apart from the events' publisher, so bulk bytes never wait in
// (or fill) the events' queue and spool, and lifecycle events never wait behind bulk bytes.
// A put blocks its caller until the relay acked the item (backpressure), resending it
// across reconnects and failover relays with the same seq until its deadline.
//
// Internal to the plugin. Any thread: calls are serialised on the one connection.
#pragma once

#include <boost/json/object.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "diaspora/client.hpp"
#include "diaspora/items.hpp"

namespace diaspora::plugin {

class ItemLink {
 public:
  /// `options()`: the options of a new connection to the relay in use (token read again);
  /// `next_relay()`: move on to the next failover relay after a failure.
  ItemLink(std::function<RelayClientOptions()> options, std::function<void()> next_relay, std::string producer_id);
  ~ItemLink();

  /// Puts one item and returns the relay's answer. Retries connection failures until
  /// `until`; throws items::ItemError for a refusal, RelayClientError (the last failure)
  /// when `until` passed, Error for bad options.
  items::PutResult put(const std::string& topic, boost::json::object event, std::string_view bytes,
                       const items::PutOptions& options, std::chrono::steady_clock::time_point until);
  /// The item at `offset` of `topic`, retrying connection failures until `until`; throws
  /// as put() does (ItemError "no_item" / "checksum_mismatch").
  items::Item get(const std::string& topic, std::uint64_t offset, std::chrono::steady_clock::time_point until);

 private:
  template <class F>
  auto with_connection(std::chrono::steady_clock::time_point until, F&& f) -> decltype(f(std::declval<RelayClient&>()));

  std::function<RelayClientOptions()> options_;
  std::function<void()> next_relay_;
  std::string producer_id_;
  std::mutex mu_;
  std::unique_ptr<RelayClient> client_;  // guarded by mu_
  std::uint64_t seq_;                    // guarded by mu_: the next put's
};

}  // namespace diaspora::plugin
