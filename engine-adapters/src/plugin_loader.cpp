#include "diaspora/plugin_loader.hpp"

#include <dlfcn.h>

#include <system_error>

#include "diaspora/error.hpp"
#include "diaspora/process.hpp"

namespace diaspora::adapters {

namespace {

template <class F>
bool resolve(void* dl, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(::dlsym(dl, name));
  if (!out) missing += std::string(missing.empty() ? "" : ", ") + name;
  return out != nullptr;
}

// Loads one candidate; empty string on success, else why not.
std::string try_load(const std::filesystem::path& path, PluginLibrary& lib) {
  ::dlerror();
  void* dl = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* e = ::dlerror();
    return e ? e : "dlopen failed";
  }
  PluginLibrary l;
  l.path = path;
  l.dl = dl;
  std::string missing;
  resolve(dl, "diaspora_abi_version", l.abi_version, missing);
  resolve(dl, "diaspora_abi_check", l.abi_check, missing);
  resolve(dl, "diaspora_library_version", l.library_version, missing);
  resolve(dl, "diaspora_status_name", l.status_name, missing);
  resolve(dl, "diaspora_open_file", l.open_file, missing);
  resolve(dl, "diaspora_open_yaml", l.open_yaml, missing);
  resolve(dl, "diaspora_close", l.close, missing);
  resolve(dl, "diaspora_last_error", l.last_error, missing);
  resolve(dl, "diaspora_task_submitted", l.task_submitted, missing);
  resolve(dl, "diaspora_task_started", l.task_started, missing);
  resolve(dl, "diaspora_task_heartbeat", l.task_heartbeat, missing);
  resolve(dl, "diaspora_task_progress", l.task_progress, missing);
  resolve(dl, "diaspora_task_completed", l.task_completed, missing);
  resolve(dl, "diaspora_task_failed", l.task_failed, missing);
  resolve(dl, "diaspora_task_cancelled", l.task_cancelled, missing);
  resolve(dl, "diaspora_metric_sample", l.metric_sample, missing);
  resolve(dl, "diaspora_data_arrived", l.data_arrived, missing);
  resolve(dl, "diaspora_resource_status", l.resource_status, missing);
  resolve(dl, "diaspora_set_action_callback", l.set_action_callback, missing);
  resolve(dl, "diaspora_action_done", l.action_done, missing);
  resolve(dl, "diaspora_action_failed", l.action_failed, missing);
  resolve(dl, "diaspora_get_stats", l.get_stats, missing);
  resolve(dl, "diaspora_item_put", l.item_put, missing);
  resolve(dl, "diaspora_item_get", l.item_get, missing);
  resolve(dl, "diaspora_item_free", l.item_free, missing);
  if (!missing.empty()) {
    ::dlclose(dl);
    return "not a Diaspora plugin (missing " + missing + ")";
  }
  char why[512] = {0};
  if (l.abi_check(DIASPORA_ABI_VERSION, why, sizeof why) != DIASPORA_OK) {
    ::dlclose(dl);
    return why;
  }
  lib = l;
  return {};
}

}  // namespace

std::vector<std::filesystem::path> default_plugin_candidates() {
  std::vector<std::filesystem::path> out;
  const auto dir = self_executable().parent_path();
  if (!dir.empty()) {
    out.push_back(dir / "libdiaspora_plugin.so");
    out.push_back(dir.parent_path() / "lib" / "libdiaspora_plugin.so");
  }
  for (const char* p : {"/usr/local/lib/libdiaspora_plugin.so", "/usr/lib/libdiaspora_plugin.so"})
    out.emplace_back(p);
  std::vector<std::filesystem::path> existing;
  for (auto& p : out) {
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) existing.push_back(p);
  }
  existing.emplace_back("libdiaspora_plugin.so");  // the dynamic linker's search path last
  return existing;
}

const PluginLibrary& load_plugin(const std::filesystem::path& explicit_path) {
  static PluginLibrary lib;
  if (lib.dl) return lib;
  std::vector<std::filesystem::path> tries =
      explicit_path.empty() ? default_plugin_candidates() : std::vector<std::filesystem::path>{explicit_path};
  std::string why;
  for (const auto& p : tries) {
    std::string e = try_load(p, lib);
    if (e.empty()) return lib;
    why += "\n  " + p.string() + ": " + e;
  }
  throw Error("cannot load the engine plugin" +
              std::string(explicit_path.empty() ? " (set plugin.library in the spec)" : " (plugin.library)") + ":" +
              why);
}

}  // namespace diaspora::adapters
