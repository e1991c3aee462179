// The relay's resilient views (docs/console.md, "Views"): the state of workflows, task
// instances, sites, resources and actions, materialised from the events the relay stores.
// Their only input is the log: every topic `<prefix>.events` (what engines and their
// policies publish) and `<prefix>.control.<engine>` (operators' actions). A snapshot under
// DATA_DIR/views/ (written every 5 s or more (at most a tenth of the time) and at stop, atomically) holds the state with
// the offset each topic was read to, so a restarted relay (even after SIGKILL) loads it and
// reads on from there: the same answers before and after. Times are the log's append
// times, so answers depend on the log alone, never on when they are asked.
//
// Internal to the relay. Thread model: one reader thread (start()) applies new records in
// offset order; notify() (from the log's commit listener) only wakes it. query(),
// changes_since() and the counters may be called from any thread at any time (a shared
// lock; the reader takes it exclusively per batch of records).
#pragma once

#include <boost/json/object.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "diaspora/error.hpp"
#include "store.hpp"

namespace diaspora::relay {

/// A query the views cannot answer (an unknown view or filter, a bad limit or cursor):
/// the message says what is wrong and what is allowed. Answered as 400.
class ViewQueryError : public Error {
 public:
  using Error::Error;
};

/// The workflow a topic belongs to ("beamline" for "beamline.events" and
/// "beamline.control.engine"), or "" when the views do not read the topic. Pure.
std::string view_workflow_of(std::string_view topic);

class Views {
 public:
  struct Options {
    std::filesystem::path dir;  ///< snapshot folder (DATA_DIR/views)
    std::chrono::milliseconds snapshot_interval{5000};  ///< at most this often, when something changed
    std::size_t max_instances = 1'000'000;  ///< task instances kept; past it the oldest finished ones go
    std::size_t max_actions = 100'000;      ///< actions kept (oldest first out)
  };

  /// Loads the snapshot if there is a usable one (else starts from the beginning of the
  /// log; a snapshot that does not parse or is ahead of the log is set aside as
  /// snapshot.json.bad and said in snapshot_note()). Throws Error when `dir` cannot be made.
  Views(const Store& store, Options options);
  /// Stops the reader and writes a last snapshot.
  ~Views();
  Views(const Views&) = delete;
  Views& operator=(const Views&) = delete;

  /// Starts the reader thread (it first catches up with the log).
  void start();
  /// Stops the reader thread (idempotent); notify() stays harmless after it, so a log
  /// still committing may go on calling it until the log is closed.
  void stop();
  /// New records were committed to `topic`. Any thread; never blocks on the reader.
  void notify(const std::string& topic);
  /// Reads everything committed now (on the calling thread; tests and benchmarks use it
  /// instead of start(): the views have one writer). Returns the records applied.
  std::size_t catch_up();
  /// True when the reader has applied everything committed (for tests' waits).
  bool caught_up() const;

  /// Answers GET /api/v1/views/<view>?<params>: workflows, tasks, sites, resources, actions,
  /// consumers. Common parameters: workflow, limit (1..1000, default 100), after (the
  /// `next` of the previous page). `may_read(workflow)` filters what the caller's token
  /// may see. Returns {"view","items","total","next","version"}. Throws ViewQueryError.
  boost::json::object query(std::string_view view, const std::map<std::string, std::string>& params,
                            const std::function<bool(const std::string&)>& may_read) const;

  /// The engine id the instance's events came from ("" when unknown): where an operator's
  /// action for it goes (<workflow>.control.<engine>). Any thread.
  std::string engine_of(const std::string& workflow, const std::string& task_id) const;
  /// The engine id of the last attempt started on a site ("" when unknown): where a drain
  /// or undrain of it goes. Any thread.
  std::string engine_of_site(const std::string& workflow, const std::string& site) const;

  /// A change for the live stream: the view and the item's id that changed, with the
  /// version it reached.
  struct Change {
    std::uint64_t version = 0;
    std::string view, workflow, id;
  };
  /// The changes after `version` (at most `max`), oldest first; `lost` is set when older
  /// changes than the ones kept (the last 65,536) were asked for: reload the views.
  std::vector<Change> changes_since(std::uint64_t version, std::size_t max, bool* lost) const;
  /// Incremented at every change.
  std::uint64_t version() const;

  /// Records applied and bad records skipped since start, and the snapshot's note.
  std::uint64_t applied() const { return applied_.load(); }
  std::uint64_t skipped() const { return skipped_.load(); }
  std::string snapshot_note() const;
  /// Writes the snapshot now (also done by the reader). Any thread.
  void write_snapshot();

  struct State;  // the materialised state (views.cpp)

 private:
  void run();
  std::size_t read_topic(const std::string& topic, std::size_t max_records);

  const Store& store_;
  Options opt_;
  std::unique_ptr<State> st_;
  mutable std::shared_mutex mu_;
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool woken_ = false;
  std::atomic<bool> pending_{false};  ///< a notify() since the reader last started a round
  bool stop_ = false;
  std::thread thread_;
  std::mutex snapshot_mu_;  ///< one snapshot writer at a time
  std::atomic<std::uint64_t> applied_{0}, skipped_{0};
  std::chrono::steady_clock::time_point last_snapshot_{};
  std::chrono::steady_clock::duration snapshot_cost_{};  ///< how long the last one took
  std::uint64_t snapshot_version_ = 0;
};

}  // namespace diaspora::relay
