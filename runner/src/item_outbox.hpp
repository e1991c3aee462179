// Output files put on the relay as data items (tasks[].output: item; docs/streaming.md),
// off the runner's thread: a put blocks until the relay acknowledged the item (resent across
// a relay restart for up to a minute), and the runner's loop must not. One thread takes the
// files in order, puts each through `put` and hands back the item's URI (or why it could not
// be put); the loop takes what is done with take() (woken through the wake pipe) and
// announces it with org.diaspora.data.arrived.
//
// Thread safety: add(), take(), pending() and drain() from the runner thread; `put` runs on
// the outbox's own thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace diaspora::runner {

/// One output to put: the instance `seq` of task `stream`, its file (written by the task),
/// the checksum the task reported ("" if none), the site it ran on and the item's topic.
struct ItemJob {
  std::string stream;
  long seq = 0;
  std::filesystem::path file;
  std::string checksum;
  std::string site;
  std::string topic;
};

/// What became of one: `uri` ("diaspora://TOPIC/OFFSET") when it was put, else `error`.
struct ItemDone {
  ItemJob job;
  long bytes = -1;
  std::string uri;
  std::string error;
};

class ItemOutbox {
 public:
  /// Puts the file's `bytes` for `job`; returns the item's URI or throws (its what() is the
  /// ItemDone's error). Called on the outbox's thread.
  using PutFn = std::function<std::string(const ItemJob& job, const std::string& bytes)>;

  /// `wake_fd`: written (one byte) when a put is done; -1: none.
  ItemOutbox(PutFn put, int wake_fd);
  /// Stops: the put in progress finishes (or times out), the others are dropped.
  ~ItemOutbox();
  ItemOutbox(const ItemOutbox&) = delete;
  ItemOutbox& operator=(const ItemOutbox&) = delete;

  void add(ItemJob job);
  /// The puts done since the last call, in the order they were added.
  std::vector<ItemDone> take();
  /// Jobs added and not yet taken back with take() (queued, being put, or done).
  std::size_t pending() const;
  /// Waits until every job added is done or `timeout_s` passed; true when all are.
  bool drain(double timeout_s);

 private:
  void work();

  PutFn put_;
  int wake_fd_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ItemJob> queue_;   // guarded by mu_
  std::vector<ItemDone> done_;  // guarded by mu_
  std::size_t busy_ = 0;        // being put; guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::thread thread_;
};

}  // namespace diaspora::runner
