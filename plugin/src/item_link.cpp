// The plugin's connection for data items (item_link.hpp).
#include "item_link.hpp"

#include <algorithm>
#include <thread>

#include "diaspora/event.hpp"

namespace diaspora::plugin {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ItemLink::ItemLink(std::function<RelayClientOptions()> options, std::function<void()> next_relay, std::string producer_id)
    : options_(std::move(options)),
      next_relay_(std::move(next_relay)),
      producer_id_(std::move(producer_id)),
      // Past every seq this producer id used before (a plugin opened again keeps its id):
      // the relay would take a lower one for a resend.
      seq_(static_cast<std::uint64_t>(now_us())) {}

ItemLink::~ItemLink() = default;

template <class F>
auto ItemLink::with_connection(Clock::time_point until, F&& f) -> decltype(f(std::declval<RelayClient&>())) {
  auto backoff = 100ms;
  for (;;) {
    try {
      if (!client_) {
        RelayClientOptions o = options_();
        o.producer_id = producer_id_;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
        o.timeout = std::clamp(left, std::chrono::milliseconds(1000), std::chrono::milliseconds(30000));
        client_ = std::make_unique<RelayClient>(o);
      }
      return f(*client_);
    } catch (const RelayClientError&) {
      client_.reset();
      next_relay_();
      if (Clock::now() + backoff >= until) throw;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    } catch (const items::ItemError&) {
      // The relay answered: the connection is sound, but what it was reading (another
      // put's chunks, a subscription) may still arrive: start the next call afresh.
      client_.reset();
      throw;
    }
  }
}

items::PutResult ItemLink::put(const std::string& topic, boost::json::object event, std::string_view bytes,
                               const items::PutOptions& options, Clock::time_point until) {
  std::lock_guard lock(mu_);
  const std::uint64_t seq = seq_++;  // the same seq on every try: a resend is known as one
  return with_connection(until, [&](RelayClient& c) { return items::put(c, topic, seq, event, bytes, options); });
}

items::Item ItemLink::get(const std::string& topic, std::uint64_t offset, Clock::time_point until) {
  std::lock_guard lock(mu_);
  return with_connection(until, [&](RelayClient& c) { return items::fetch(c, topic, offset); });
}

}  // namespace diaspora::plugin
