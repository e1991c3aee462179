// Rehearsal config files: defaults, every key, schema errors located in the file.
#include <gtest/gtest.h>

#include <fstream>

#include "diaspora/rehearsal_config.hpp"
#include "rehearsal_test_util.hpp"

namespace dr = diaspora::rehearsal;

namespace {
std::string first_error(std::string_view yaml) {
  try {
    dr::load_config_string(yaml, "r.yaml");
  } catch (const diaspora::SpecError& e) {
    return e.diagnostics().front().str();
  }
  return "";
}
}  // namespace

TEST(RehearsalConfig, DefaultsForAnEmptyMapping) {
  auto c = dr::load_config_string("{}", "empty.yaml");
  EXPECT_EQ(c.buffer.memory_bytes, 64ull << 20);
  EXPECT_TRUE(c.buffer.class_balanced);
  EXPECT_EQ(c.buffer.label_tensor, 1);
  EXPECT_EQ(c.insertion.queue_batches, 16u);
  EXPECT_EQ(c.sampling.representatives, 32);
  EXPECT_TRUE(c.sampling.prefetch);
  EXPECT_EQ(c.sampling.backend, "gloo");
  EXPECT_EQ(c.sampling.timeout, std::chrono::milliseconds(60000));
  EXPECT_THROW(dr::load_config_string("", "empty.yaml"), diaspora::SpecError);  // like every YAML input
}

TEST(RehearsalConfig, ReadsEveryKey) {
  auto c = dr::load_config_string(R"(
buffer:
  memory: 512KiB
  max_samples: 1000
  class_balanced: false
  label_tensor: 2
  seed: 9
insertion:
  queue_batches: 4
sampling:
  representatives: 16
  seed: 3
  prefetch: false
  backend: gloo
  comm_device: cpu
  timeout: 1.5m
)");
  EXPECT_EQ(c.buffer.memory_bytes, 512u * 1024u);
  EXPECT_EQ(c.buffer.max_samples, 1000u);
  EXPECT_FALSE(c.buffer.class_balanced);
  EXPECT_EQ(c.buffer.label_tensor, 2);
  EXPECT_EQ(c.buffer.seed, 9u);
  EXPECT_EQ(c.insertion.queue_batches, 4u);
  EXPECT_EQ(c.sampling.representatives, 16);
  EXPECT_EQ(c.sampling.seed, 3u);
  EXPECT_FALSE(c.sampling.prefetch);
  EXPECT_EQ(c.sampling.timeout, std::chrono::milliseconds(90000));
  EXPECT_EQ(dr::load_config_string("buffer: {memory: 4096}").buffer.memory_bytes, 4096u);
}

TEST(RehearsalConfig, ErrorsNameFileLineAndKey) {
  EXPECT_EQ(first_error("buffer:\n  memroy: 1MiB\n"),
            "r.yaml:2:3: error: buffer.memroy: unknown key 'memroy'; did you mean 'memory'?");
  EXPECT_NE(first_error("buffer:\n  memory: lots\n").find("r.yaml:2:11: error: buffer.memory: must be a size"),
            std::string::npos);
  EXPECT_NE(first_error("buffer:\n  memory: 0B\n").find("buffer.memory: must be at least 1 byte"), std::string::npos);
  EXPECT_NE(first_error("sampling:\n  representatives: 0\n").find("sampling.representatives"), std::string::npos);
  EXPECT_NE(first_error("sampling:\n  backend: nccl\n").find("backend nccl needs comm_device cuda"),
            std::string::npos);
  EXPECT_NE(first_error("sampling:\n  comm_device: tpu\n").find("must be cpu, cuda or cuda:N"), std::string::npos);
  EXPECT_NE(first_error("trainer: {}\n").find("unknown key 'trainer'"), std::string::npos);
}

TEST(RehearsalConfig, LoadsFiles) {
  dr::test::TempDir dir;
  auto file = dir.path() / "rehearsal.yaml";
  std::ofstream(file) << "sampling:\n  representatives: 8\n";
  EXPECT_EQ(dr::load_config_file(file).sampling.representatives, 8);
  EXPECT_THROW(dr::load_config_file(dir.path() / "missing.yaml"), diaspora::SpecError);
  EXPECT_THROW(dr::load_config_file(dir.path()), diaspora::SpecError);
}
