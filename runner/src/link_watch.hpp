// Congested consumers as a policy signal (docs/run.md, "Congested consumers"): the run's
// relay reports each congested connection on <prefix>.links (org.diaspora.resource.status,
// kind link; the embedded relay is set up so, a relay of the run's own can be pointed
// there with qos.congestion_topic). A connection whose client named the task it works for
// in hello (`task`: diaspora-train does, from DIASPORA_TASK_ID) becomes a heartbeat of that
// task's running attempt with the metric link_wait_s: the longest wait of its control,
// lifecycle or telemetry frames in the interval (0 once the relay says the link is up),
// which the policies read as task.link_wait (throttle the stream, move the consumer).
//
// Thread safety: the runner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <boost/json/object.hpp>

#include "context.hpp"
#include "store.hpp"

namespace diaspora {
class TopicReader;
}

namespace diaspora::runner {

class LinkWatch {
 public:
  LinkWatch(Context& ctx, InstanceStore& store);
  ~LinkWatch();
  LinkWatch(const LinkWatch&) = delete;
  LinkWatch& operator=(const LinkWatch&) = delete;

  /// The topic it reads: <prefix>.links.
  std::string topic() const;
  /// Takes the congestion events that arrived (never waits for one); connects first, and
  /// again after the relay went away (1 s, doubling to 30 s). Events from before the run
  /// started are passed over (a resumed run's log holds the earlier run's). Nothing at all
  /// unless a policy of the spec watches task.link_wait.
  void tick();
  /// The link events taken for a running attempt so far.
  std::uint64_t told() const noexcept { return told_; }

 private:
  void take(const boost::json::object& event);
  Context& ctx_;
  InstanceStore& store_;
  std::unique_ptr<TopicReader> reader_;
  bool wanted_ = false;  ///< a policy watches task.link_wait
  double next_try_ = 0, backoff_ = 1;
  std::uint64_t told_ = 0;
};

}  // namespace diaspora::runner
