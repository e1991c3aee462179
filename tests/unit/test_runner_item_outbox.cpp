// The runner's item outbox (runner/src/item_outbox.cpp): outputs put off the runner's
// thread, handed back in order with their URI or why they could not be put.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "item_outbox.hpp"

namespace fs = std::filesystem;
using diaspora::runner::ItemDone;
using diaspora::runner::ItemJob;
using diaspora::runner::ItemOutbox;

namespace {

fs::path file_with(const fs::path& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir / name, std::ios::binary) << bytes;
  return dir / name;
}

}  // namespace

TEST(RunnerItemOutbox, PutsEachFileOffTheCallersThreadAndHandsBackItsUriInOrder) {
  const fs::path dir = fs::temp_directory_path() / ("outbox-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  std::atomic<int> calls{0};
  {
    ItemOutbox box(
        [&](const ItemJob& j, const std::string& bytes) {
          ++calls;
          if (j.seq == 1) throw std::runtime_error("the relay refused it");
          return "diaspora://" + j.topic + "/" + std::to_string(j.seq * 10) + "#" + bytes;
        },
        pipe_fds[1]);
    for (long i = 0; i < 3; ++i)
      box.add({"scan", i, file_with(dir, "s" + std::to_string(i), "bytes" + std::to_string(i)), "", "edge", "wf.data.scan"});
    box.add({"scan", 3, dir / "missing", "", "edge", "wf.data.scan"});
    ASSERT_TRUE(box.drain(10));
    char byte = 0;
    EXPECT_EQ(::read(pipe_fds[0], &byte, 1), 1);  // the loop was woken
    std::vector<ItemDone> done = box.take();
    ASSERT_EQ(done.size(), 4u);
    EXPECT_EQ(done[0].uri, "diaspora://wf.data.scan/0#bytes0");
    EXPECT_EQ(done[0].bytes, 6);
    EXPECT_TRUE(done[0].error.empty());
    EXPECT_TRUE(done[1].uri.empty());
    EXPECT_EQ(done[1].error, "the relay refused it");
    EXPECT_EQ(done[2].uri, "diaspora://wf.data.scan/20#bytes2");
    EXPECT_FALSE(done[3].error.empty());  // the file could not be read: said, not put
    EXPECT_EQ(calls.load(), 3);
    EXPECT_EQ(box.pending(), 0u);
    EXPECT_TRUE(box.take().empty());
  }
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  fs::remove_all(dir);
}

TEST(RunnerItemOutbox, DrainTimesOutWhileAPutIsStuck) {
  std::atomic<bool> release{false};
  ItemOutbox box(
      [&](const ItemJob&, const std::string&) {
        while (!release) ::usleep(1000);
        return std::string("diaspora://t/0");
      },
      -1);
  const fs::path f = fs::temp_directory_path() / ("outbox-stuck-" + std::to_string(::getpid()));
  std::ofstream(f) << "x";
  box.add({"s", 0, f, "", "", "t"});
  EXPECT_FALSE(box.drain(0.05));
  EXPECT_EQ(box.pending(), 1u);
  release = true;
  EXPECT_TRUE(box.drain(10));
  EXPECT_EQ(box.take().size(), 1u);
  fs::remove(f);
}
