// The engine plugin seen as a third-party engine sees it: libdiaspora_plugin.so loaded
// with dlopen, every function looked up by name from the public C ABI
// (diaspora/plugin.h), nothing else. The runner never links the plugin.
//
// Thread safety: a loaded PluginLibrary is immutable; its function pointers may be called
// from any thread under the ABI's own rules. PluginHandle is owned by the runner thread;
// hooks may be called from any thread (the ABI allows it).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "diaspora/plugin.h"

namespace diaspora::adapters {

/// Every ABI function the runner uses, resolved with dlsym.
struct PluginLibrary {
  std::filesystem::path path;  ///< the file that was loaded
  void* dl = nullptr;

  decltype(&::diaspora_abi_version) abi_version = nullptr;
  decltype(&::diaspora_abi_check) abi_check = nullptr;
  decltype(&::diaspora_library_version) library_version = nullptr;
  decltype(&::diaspora_status_name) status_name = nullptr;
  decltype(&::diaspora_open_file) open_file = nullptr;
  decltype(&::diaspora_open_yaml) open_yaml = nullptr;
  decltype(&::diaspora_close) close = nullptr;
  decltype(&::diaspora_last_error) last_error = nullptr;
  decltype(&::diaspora_task_submitted) task_submitted = nullptr;
  decltype(&::diaspora_task_started) task_started = nullptr;
  decltype(&::diaspora_task_heartbeat) task_heartbeat = nullptr;
  decltype(&::diaspora_task_progress) task_progress = nullptr;
  decltype(&::diaspora_task_completed) task_completed = nullptr;
  decltype(&::diaspora_task_failed) task_failed = nullptr;
  decltype(&::diaspora_task_cancelled) task_cancelled = nullptr;
  decltype(&::diaspora_metric_sample) metric_sample = nullptr;
  decltype(&::diaspora_data_arrived) data_arrived = nullptr;
  decltype(&::diaspora_resource_status) resource_status = nullptr;
  decltype(&::diaspora_set_action_callback) set_action_callback = nullptr;
  decltype(&::diaspora_action_done) action_done = nullptr;
  decltype(&::diaspora_action_failed) action_failed = nullptr;
  decltype(&::diaspora_get_stats) get_stats = nullptr;
  decltype(&::diaspora_item_put) item_put = nullptr;    ///< ABI 1.3: data items (docs/streaming.md)
  decltype(&::diaspora_item_get) item_get = nullptr;
  decltype(&::diaspora_item_free) item_free = nullptr;
};

/// Where the runner looks for the plugin when the spec names none: the library next to
/// the runner's binary (../lib/ of a build or install tree), then the installed one, then
/// the dynamic linker's search path. Each candidate that exists, in order.
std::vector<std::filesystem::path> default_plugin_candidates();

/// Loads the plugin: `explicit_path` when set (plugin.library), else the first default
/// candidate that loads. Checks the ABI (same major, minor >= the header's). Throws
/// diaspora::Error saying which files were tried and why each failed (dlerror, a missing
/// symbol, an ABI mismatch). The library stays loaded for the life of the process.
/// Runner thread, once.
const PluginLibrary& load_plugin(const std::filesystem::path& explicit_path);

}  // namespace diaspora::adapters
