// The trainer's connections to a relay (ptycho-stream's scans, checkpoints as data items):
// relay_options_from_files(), plus the site and task diaspora run gave the job
// (DIASPORA_SITE, DIASPORA_TASK_ID), said in hello so that the relay's congestion events
// name the task (docs/streaming.md, "Congestion as events"). Internal to the trainer.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "diaspora/topic_reader.hpp"

namespace diaspora::rehearsal::detail {

/// @throws RelayClientError as relay_options_from_files().
inline RelayClientOptions fabric_options(const std::string& url, const std::filesystem::path& ca_file,
                                         const std::filesystem::path& token_file, const std::string& client_id) {
  RelayClientOptions o = relay_options_from_files(url, ca_file, token_file, client_id);
  if (const char* s = std::getenv("DIASPORA_SITE"); s && *s) o.site = std::string(s).substr(0, 256);
  if (const char* t = std::getenv("DIASPORA_TASK_ID"); t && *t) o.task = std::string(t).substr(0, 256);
  return o;
}

}  // namespace diaspora::rehearsal::detail
