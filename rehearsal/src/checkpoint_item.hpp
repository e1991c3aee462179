// A checkpoint as one data item on a relay (docs/rehearsal.md, "Checkpoints as data items"):
// how a job moves between sites that share no file system. The item's bytes are the
// checkpoint folder's files one after the other; its event (org.diaspora.data.item,
// content_type application/vnd.diaspora.checkpoint, seq the step) names them with their
// sizes in data.files, and the item's SHA-256 covers them all. Internal to the trainer; fetching is fetch_checkpoint_item() of
// diaspora/trainer.hpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "diaspora/trainer.hpp"

namespace diaspora {
class RelayClient;
}

namespace diaspora::rehearsal::detail {

/// Puts checkpoints on cfg.checkpoint_item_topic. One thread (rank 0's training loop).
class CheckpointShipper {
 public:
  explicit CheckpointShipper(const TrainerConfig& cfg);
  ~CheckpointShipper();
  CheckpointShipper(const CheckpointShipper&) = delete;
  CheckpointShipper& operator=(const CheckpointShipper&) = delete;

  /// Puts the published checkpoint folder `dir` (its manifest and rank files) as one item
  /// and returns its diaspora://TOPIC/OFFSET URI. A relay that is away is tried again every
  /// second for `patience_s` (the same seq: a put the relay took before the connection
  /// dropped is not stored twice). @throws RehearsalError when the relay refuses it, a file
  /// cannot be read, or the relay stayed away (its last error).
  std::string ship(const std::filesystem::path& dir, std::int64_t step, double patience_s = 30);

 private:
  TrainerConfig cfg_;
  std::string producer_;
  std::uint64_t seq_ = 0;
  std::unique_ptr<RelayClient> client_;
};

}  // namespace diaspora::rehearsal::detail
