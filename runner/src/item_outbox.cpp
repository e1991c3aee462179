#include "item_outbox.hpp"

#include <unistd.h>

#include <chrono>
#include <exception>

#include "diaspora/files.hpp"
#include "diaspora/thread_name.hpp"

namespace diaspora::runner {

ItemOutbox::ItemOutbox(PutFn put, int wake_fd) : put_(std::move(put)), wake_fd_(wake_fd) {
  thread_ = std::thread([this] { work(); });
}

ItemOutbox::~ItemOutbox() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ItemOutbox::add(ItemJob job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

std::vector<ItemDone> ItemOutbox::take() {
  std::lock_guard lock(mu_);
  std::vector<ItemDone> out;
  out.swap(done_);
  return out;
}

std::size_t ItemOutbox::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + busy_ + done_.size();
}

bool ItemOutbox::drain(double timeout_s) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return queue_.empty() && busy_ == 0; });
}

void ItemOutbox::work() {
  name_this_thread("runner-items");
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    ItemDone d;
    d.job = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    try {
      const std::string bytes = read_file(d.job.file);
      d.bytes = static_cast<long>(bytes.size());
      d.uri = put_(d.job, bytes);
    } catch (const std::exception& e) {
      d.error = e.what();
    }
    lock.lock();
    --busy_;
    done_.push_back(std::move(d));
    cv_.notify_all();
    if (wake_fd_ >= 0) {
      const char byte = 1;
      [[maybe_unused]] const auto n = ::write(wake_fd_, &byte, 1);  // a full pipe already wakes the loop
    }
  }
}

}  // namespace diaspora::runner
