// The C ABI: argument checks, then the Plugin. No exception crosses this boundary: every
// entry catches everything and returns a status.
#include <boost/json.hpp>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "diaspora/event.hpp"
#include "diaspora/items.hpp"
#include "diaspora/plugin.h"
#include "diaspora/spec.hpp"
#include "diaspora/version.hpp"
#include "plugin_impl.hpp"

struct diaspora_plugin {
  std::unique_ptr<diaspora::plugin::Plugin> impl;
};

namespace {

// The sizes of the ABI 1.0 structs. A caller's struct_size must be at least these; a
// later minor version that appends fields reads them only when struct_size covers them,
// so callers built against an older header keep working. Changing a 1.0 struct breaks
// these assertions on purpose.
// Frozen for LP64 (x86-64, aarch64); other data models use the current sizes (for
// diaspora_action, where the 1.0 struct ended).
template <class T>
constexpr std::size_t v1_size(std::size_t lp64) {
  return sizeof(void*) == 8 ? lp64 : sizeof(T);
}
constexpr std::size_t kTaskInfoV1 = sizeof(void*) == 8 ? 112 : offsetof(diaspora_task_info, failure), kMetricV1 = v1_size<diaspora_metric>(48),
                      kDataInfoV1 = v1_size<diaspora_data_info>(64), kResourceInfoV1 = v1_size<diaspora_resource_info>(64),
                      kActionV1 = sizeof(void*) == 8 ? 5176 : offsetof(diaspora_action, requested_us), kStatsV1 = v1_size<diaspora_stats>(104);
// ABI 1.2 appended failure to diaspora_task_info; a 1.0 / 1.1 caller's struct ends before it.
static_assert(offsetof(diaspora_task_info, failure) == kTaskInfoV1, "diaspora_task_info: append fields only");
static_assert(sizeof(diaspora_metric) == kMetricV1 &&
                  sizeof(diaspora_data_info) == kDataInfoV1 && sizeof(diaspora_resource_info) == kResourceInfoV1 &&
                  sizeof(diaspora_stats) == kStatsV1,
              "an ABI 1.0 struct changed size: append fields only, and keep the V1 sizes here");
// ABI 1.1 appended requested_us to diaspora_action; a 1.0 caller's struct ends before it.
static_assert(offsetof(diaspora_action, requested_us) == kActionV1 &&
                  sizeof(diaspora_action) == kActionV1 + sizeof(int64_t),
              "diaspora_action: ABI 1.1 appends requested_us right after the 1.0 struct");

using diaspora::plugin::Field;
using diaspora::plugin::HookArgs;
using diaspora::plugin::Kind;
namespace dp = diaspora::plugin;

void write_buf(char* buf, std::size_t len, std::string_view msg) noexcept {
  if (!buf || len == 0) return;
  const std::size_t n = std::min(msg.size(), len - 1);
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}

// Fails a call: records the message on the handle, returns the status. (Building `msg`
// may throw std::bad_alloc in the caller: every entry point runs inside guarded().)
int fail(diaspora_plugin* p, int status, const std::string& msg) noexcept {
  try {
    if (p && p->impl) p->impl->set_error(msg);
  } catch (...) {  // out of memory for the message: the status still tells what failed
  }
  return status;
}

// Names an argument in messages, e.g. "task_id" or "metrics[3].name". Formatted only when
// a check fails: the hook path must not allocate.
struct Label {
  Label(const char* n, std::size_t i = SIZE_MAX, const char* m = "") noexcept : name(n), index(i), member(m) {}
  const char* name;
  std::size_t index;  // SIZE_MAX: not an array element
  const char* member;
  std::string str() const {
    return index == SIZE_MAX ? std::string(name) : std::string(name) + "[" + std::to_string(index) + "]" + member;
  }
};

// Checks an optional (or, with `required`, mandatory) string argument.
int check_str(diaspora_plugin* p, const char* s, std::size_t max, bool required, const Label& what,
              std::string_view& out) {
  if (!s) {
    if (required) return fail(p, DIASPORA_ERR_NULL, what.str() + " is NULL (required)");
    out = {};
    return DIASPORA_OK;
  }
  const std::size_t n = strnlen(s, max + 1);
  if (n > max) return fail(p, DIASPORA_ERR_INVALID, what.str() + " is longer than " + std::to_string(max) + " bytes");
  if (n == 0 && required) return fail(p, DIASPORA_ERR_INVALID, what.str() + " is empty (required)");
  out = std::string_view(s, n);
  return DIASPORA_OK;
}

// [A-Za-z0-9_.:-], by table (no locale-aware call per character on the hook path).
constexpr auto kNameChars = [] {
  std::array<bool, 256> t{};
  for (int c = 0; c < 256; ++c)
    t[static_cast<std::size_t>(c)] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                     c == '_' || c == '.' || c == ':' || c == '-';
  return t;
}();

bool metric_name_ok(std::string_view n) noexcept {
  for (char c : n)
    if (!kNameChars[static_cast<unsigned char>(c)]) return false;
  return true;
}

int check_metrics(diaspora_plugin* p, const diaspora_metric_value* m, std::size_t count, HookArgs& a) {
  if (count == 0) return DIASPORA_OK;
  if (!m) return fail(p, DIASPORA_ERR_NULL, "metrics is NULL but metric_count is " + std::to_string(count));
  if (count > DIASPORA_MAX_METRICS)
    return fail(p, DIASPORA_ERR_INVALID, "metric_count " + std::to_string(count) + " is over DIASPORA_MAX_METRICS (64)");
  for (std::size_t i = 0; i < count; ++i) {
    std::string_view name;
    const Label what{"metrics", i, ".name"};
    if (int rc = check_str(p, m[i].name, DIASPORA_MAX_METRIC_NAME, true, what, name)) return rc;
    if (!metric_name_ok(name))
      return fail(p, DIASPORA_ERR_INVALID,
                  what.str() + " '" + std::string(name) + "' may only hold letters, digits, '_', '.', ':' and '-'");
    if (!std::isfinite(m[i].value)) return fail(p, DIASPORA_ERR_INVALID, Label{"metrics", i, ".value"}.str() + " is not finite");
    a.metric_len[i] = static_cast<std::uint8_t>(name.size());
  }
  a.metrics = m;
  a.metric_count = count;
  return DIASPORA_OK;
}

// 9999-12-31T23:59:59.999999Z: the last time an RFC 3339 timestamp can hold.
constexpr std::int64_t kMaxTimeUs = 253402300799999999;

int check_time(diaspora_plugin* p, std::int64_t t, HookArgs& a) {
  if (t < 0) return fail(p, DIASPORA_ERR_INVALID, "timestamp_us is negative");
  if (t > kMaxTimeUs)
    return fail(p, DIASPORA_ERR_INVALID, "timestamp_us is after the year 9999 (microseconds expected, not nanoseconds?)");
  if (t != 0) {
    a.head.time_us = t;
  } else if (p->impl->tick_time()) {  // the publisher turns ticks into wall-clock time
    a.head.time_us = static_cast<std::int64_t>(dp::TickClock::ticks());
    a.head.flags |= dp::time_in_ticks;
  } else {
    a.head.time_us = diaspora::now_us();
  }
  return DIASPORA_OK;
}

// DIASPORA_ERR_INTERNAL, with "internal error: <what>" as the handle's last error when
// there is memory left for the message.
int internal_error(diaspora_plugin* p, const char* what) noexcept {
  try {
    return fail(p, DIASPORA_ERR_INTERNAL, std::string("internal error") + (what ? std::string(": ") + what : ""));
  } catch (...) {
    return DIASPORA_ERR_INTERNAL;
  }
}

// Wraps a body so that nothing escapes as an exception.
template <class Body>
int guarded(diaspora_plugin* p, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return internal_error(p, e.what());
  } catch (...) {
    return internal_error(p, nullptr);
  }
}

#define DIASPORA_TRY(expr)         \
  do {                             \
    if (int rc_ = (expr)) return rc_; \
  } while (0)

int task_hook(diaspora_plugin* p, const diaspora_task_info* info, Kind kind) {
  if (!p || !p->impl) return DIASPORA_ERR_NULL;
  if (!info) return fail(p, DIASPORA_ERR_NULL, "info is NULL");
  if (info->struct_size < kTaskInfoV1)
    return fail(p, DIASPORA_ERR_INVALID, "info->struct_size is " + std::to_string(info->struct_size) +
                                             ", expected sizeof(diaspora_task_info) = " + std::to_string(sizeof(diaspora_task_info)));
  if (p->impl->closing()) return DIASPORA_ERR_CLOSED;
  HookArgs a;
  a.head.kind = kind;
  DIASPORA_TRY(check_str(p, info->task_id, DIASPORA_MAX_ID, true, "task_id", a.strings[dp::f_key]));
  DIASPORA_TRY(check_str(p, info->site, DIASPORA_MAX_ID, false, "site", a.strings[dp::f_site]));
  DIASPORA_TRY(check_str(p, info->worker, DIASPORA_MAX_ID, false, "worker", a.strings[dp::f_worker]));
  DIASPORA_TRY(check_str(p, info->name, DIASPORA_MAX_ID, false, "name", a.strings[dp::f_name]));
  DIASPORA_TRY(check_time(p, info->timestamp_us, a));
  if (info->attempt < 0) return fail(p, DIASPORA_ERR_INVALID, "attempt is negative");
  a.head.attempt = info->attempt;
  if (info->has_exit_code) {
    a.head.flags |= dp::has_exit_code;
    a.head.exit_code = info->exit_code;
  }
  switch (kind) {
    case Kind::submitted:
      if (!std::isfinite(info->deadline_s) || info->deadline_s < 0)
        return fail(p, DIASPORA_ERR_INVALID, "deadline_s must be a finite number >= 0 (0 = none)");
      if (info->deadline_s > 0) {
        a.head.flags |= dp::has_deadline;
        a.head.number = info->deadline_s;
      }
      break;
    case Kind::progress:
      if (!(info->progress >= 0.0 && info->progress <= 1.0))
        return fail(p, DIASPORA_ERR_INVALID, "progress must be in [0, 1]");
      a.head.number = info->progress;
      if (info->step < -1) return fail(p, DIASPORA_ERR_INVALID, "step must be >= 0, or -1 for none");
      if (info->step >= 0) {
        a.head.flags |= dp::has_step;
        a.head.integer = info->step;
      }
      [[fallthrough]];
    case Kind::heartbeat:
      DIASPORA_TRY(check_metrics(p, info->metrics, info->metric_count, a));
      break;
    case Kind::failed:
      DIASPORA_TRY(check_str(p, info->reason, DIASPORA_MAX_TEXT, true, "reason", a.strings[dp::f_text]));
      if (info->retryable) a.head.flags |= dp::retryable;
      if (info->struct_size >= offsetof(diaspora_task_info, failure) + sizeof(info->failure)) {
        if (info->failure < DIASPORA_FAILURE_UNKNOWN || info->failure > DIASPORA_FAILURE_LOST)
          return fail(p, DIASPORA_ERR_INVALID, "failure must be a diaspora_failure_kind (0, 1 or 2), not " +
                                                   std::to_string(info->failure));
        a.head.integer = info->failure;  // (a failed record has no step)
      }
      break;
    case Kind::cancelled:
      DIASPORA_TRY(check_str(p, info->reason, DIASPORA_MAX_TEXT, false, "reason", a.strings[dp::f_text]));
      break;
    default:
      break;
  }
  return p->impl->enqueue(a);
}

constexpr const char* kResourceKinds[] = {"site", "worker", "node", "gpu", "link", "relay"};
constexpr const char* kResourceStates[] = {"up", "degraded", "down", "unknown"};

template <std::size_t N>
bool one_of(std::string_view s, const char* const (&set)[N]) noexcept {
  for (const char* x : set)
    if (s == x) return true;
  return false;
}

bool checksum_ok(std::string_view c) noexcept {
  const auto colon = c.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == c.size()) return false;
  for (std::size_t i = 0; i < colon; ++i)
    if (!(std::islower(static_cast<unsigned char>(c[i])) || std::isdigit(static_cast<unsigned char>(c[i])))) return false;
  for (std::size_t i = colon + 1; i < c.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(c[i]))) return false;
  return true;
}

}  // namespace

extern "C" {

DIASPORA_API uint32_t diaspora_abi_version(void) { return DIASPORA_ABI_VERSION; }

DIASPORA_API const char* diaspora_library_version(void) { return diaspora::version_string; }

DIASPORA_API int diaspora_abi_check(uint32_t caller_version, char* errbuf, size_t errbuf_len) {
  if (DIASPORA_ABI_COMPATIBLE(DIASPORA_ABI_VERSION) &&
      (caller_version >> 16) == DIASPORA_ABI_VERSION_MAJOR && (caller_version & 0xffffu) <= DIASPORA_ABI_VERSION_MINOR) {
    write_buf(errbuf, errbuf_len, "");
    return DIASPORA_OK;
  }
  char msg[256];
  std::snprintf(msg, sizeof msg,
                "plugin library ABI %u.%u cannot serve an engine built for ABI %u.%u: %s", DIASPORA_ABI_VERSION_MAJOR,
                DIASPORA_ABI_VERSION_MINOR, caller_version >> 16, caller_version & 0xffffu,
                (caller_version >> 16) != DIASPORA_ABI_VERSION_MAJOR
                    ? "the major versions differ; load a libdiaspora_plugin.so of the engine's major version"
                    : "the library is older than the engine's header; install a newer libdiaspora_plugin.so");
  write_buf(errbuf, errbuf_len, msg);
  return DIASPORA_ERR_VERSION;
}

DIASPORA_API const char* diaspora_status_name(int status) {
  switch (status) {
    case DIASPORA_OK: return "DIASPORA_OK";
    case DIASPORA_ERR_NULL: return "DIASPORA_ERR_NULL";
    case DIASPORA_ERR_INVALID: return "DIASPORA_ERR_INVALID";
    case DIASPORA_ERR_CONFIG: return "DIASPORA_ERR_CONFIG";
    case DIASPORA_ERR_IO: return "DIASPORA_ERR_IO";
    case DIASPORA_ERR_CLOSED: return "DIASPORA_ERR_CLOSED";
    case DIASPORA_ERR_TIMEOUT: return "DIASPORA_ERR_TIMEOUT";
    case DIASPORA_ERR_NOT_FOUND: return "DIASPORA_ERR_NOT_FOUND";
    case DIASPORA_ERR_EMPTY: return "DIASPORA_ERR_EMPTY";
    case DIASPORA_ERR_VERSION: return "DIASPORA_ERR_VERSION";
    case DIASPORA_ERR_INTERNAL: return "DIASPORA_ERR_INTERNAL";
    default: return "unknown status";
  }
}

static int open_common(const diaspora::SpecLoadResult& loaded, const std::filesystem::path& base, diaspora_plugin** out,
                       char* errbuf, size_t errbuf_len) noexcept {
  try {
    if (!loaded.ok()) {
      std::string msg;
      for (const auto& d : loaded.diagnostics) msg += d.str() + "\n";
      write_buf(errbuf, errbuf_len, msg);
      return DIASPORA_ERR_CONFIG;
    }
    dp::Config cfg = dp::Config::from_spec(*loaded.spec, base);
    auto handle = std::make_unique<diaspora_plugin>();
    handle->impl = std::make_unique<dp::Plugin>(std::move(cfg));
    *out = handle.release();
    write_buf(errbuf, errbuf_len, "");
    return DIASPORA_OK;
  } catch (const dp::ConfigError& e) {
    const std::string file = loaded.spec ? loaded.spec->file : "<spec>";
    const std::string what = e.what();  // located already (a policy), or about the whole file
    write_buf(errbuf, errbuf_len, what.starts_with(file + ":") ? what : file + ": error: " + what);
    return DIASPORA_ERR_CONFIG;
  } catch (const dp::SpoolError& e) {
    write_buf(errbuf, errbuf_len, e.what());
    return DIASPORA_ERR_IO;
  } catch (const std::exception& e) {
    write_buf(errbuf, errbuf_len, std::string("internal error: ") + e.what());
    return DIASPORA_ERR_INTERNAL;
  } catch (...) {
    write_buf(errbuf, errbuf_len, "internal error");
    return DIASPORA_ERR_INTERNAL;
  }
}

DIASPORA_API int diaspora_open_file(const char* spec_path, diaspora_plugin** out, char* errbuf, size_t errbuf_len) {
  if (out) *out = nullptr;
  if (!spec_path || !out) {
    write_buf(errbuf, errbuf_len, !out ? "out is NULL" : "spec_path is NULL");
    return DIASPORA_ERR_NULL;
  }
  try {
    const std::filesystem::path path(spec_path);
    return open_common(diaspora::load_spec_file(path), path.parent_path(), out, errbuf, errbuf_len);
  } catch (...) {
    write_buf(errbuf, errbuf_len, "internal error");
    return DIASPORA_ERR_INTERNAL;
  }
}

DIASPORA_API int diaspora_open_yaml(const char* yaml, diaspora_plugin** out, char* errbuf, size_t errbuf_len) {
  if (out) *out = nullptr;
  if (!yaml || !out) {
    write_buf(errbuf, errbuf_len, !out ? "out is NULL" : "yaml is NULL");
    return DIASPORA_ERR_NULL;
  }
  try {
    return open_common(diaspora::load_spec_string(yaml, "<yaml>"), {}, out, errbuf, errbuf_len);
  } catch (...) {
    write_buf(errbuf, errbuf_len, "internal error");
    return DIASPORA_ERR_INTERNAL;
  }
}

DIASPORA_API int diaspora_close(diaspora_plugin* plugin, int64_t flush_timeout_ms) {
  if (!plugin || !plugin->impl) return DIASPORA_ERR_NULL;
  if (flush_timeout_ms < 0) return fail(plugin, DIASPORA_ERR_INVALID, "flush_timeout_ms is negative");
  if (plugin->impl->on_control_thread())
    return fail(plugin, DIASPORA_ERR_CLOSED, "diaspora_close called from the action callback: close from another thread");
  const int rc = plugin->impl->close(std::chrono::milliseconds(flush_timeout_ms));
  delete plugin;
  return rc;
}

DIASPORA_API size_t diaspora_last_error(const diaspora_plugin* plugin, char* buf, size_t buf_len) {
  if (!plugin || !plugin->impl) {
    write_buf(buf, buf_len, "");
    return 0;
  }
  try {
    const std::string e = plugin->impl->last_error();
    write_buf(buf, buf_len, e);
    return e.size();
  } catch (...) {
    write_buf(buf, buf_len, "");
    return 0;
  }
}

DIASPORA_API int diaspora_task_submitted(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::submitted); });
}
DIASPORA_API int diaspora_task_started(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::started); });
}
DIASPORA_API int diaspora_task_heartbeat(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::heartbeat); });
}
DIASPORA_API int diaspora_task_progress(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::progress); });
}
DIASPORA_API int diaspora_task_completed(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::completed); });
}
DIASPORA_API int diaspora_task_failed(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::failed); });
}
DIASPORA_API int diaspora_task_cancelled(diaspora_plugin* p, const diaspora_task_info* i) {
  return guarded(p, [&] { return task_hook(p, i, Kind::cancelled); });
}

DIASPORA_API int diaspora_metric_sample(diaspora_plugin* p, const diaspora_metric* m) {
  return guarded(p, [&]() -> int {
    if (!p || !p->impl) return DIASPORA_ERR_NULL;
    if (!m) return fail(p, DIASPORA_ERR_NULL, "metric is NULL");
    if (m->struct_size < kMetricV1)
      return fail(p, DIASPORA_ERR_INVALID, "metric->struct_size is smaller than sizeof(diaspora_metric)");
    if (p->impl->closing()) return DIASPORA_ERR_CLOSED;
    HookArgs a;
    a.head.kind = Kind::metric;
    a.coalescible = true;
    if (m->scope < DIASPORA_SCOPE_TASK || m->scope > DIASPORA_SCOPE_RESOURCE)
      return fail(p, DIASPORA_ERR_INVALID, "scope " + std::to_string(m->scope) + " is not a diaspora_scope (1, 2 or 3)");
    a.head.scope = static_cast<std::uint8_t>(m->scope);
    DIASPORA_TRY(check_str(p, m->id, DIASPORA_MAX_ID, true, "id", a.strings[dp::f_key]));
    DIASPORA_TRY(check_str(p, m->name, DIASPORA_MAX_METRIC_NAME, true, "name", a.strings[dp::f_name]));
    if (!metric_name_ok(a.strings[dp::f_name]))
      return fail(p, DIASPORA_ERR_INVALID, "name '" + std::string(a.strings[dp::f_name]) + "' may only hold letters, digits, '_', '.', ':' and '-'");
    if (!std::isfinite(m->value)) return fail(p, DIASPORA_ERR_INVALID, "value is not finite");
    a.head.number = m->value;
    DIASPORA_TRY(check_time(p, m->timestamp_us, a));
    return p->impl->enqueue(a);
  });
}

DIASPORA_API int diaspora_data_arrived(diaspora_plugin* p, const diaspora_data_info* d) {
  return guarded(p, [&]() -> int {
    if (!p || !p->impl) return DIASPORA_ERR_NULL;
    if (!d) return fail(p, DIASPORA_ERR_NULL, "info is NULL");
    if (d->struct_size < kDataInfoV1)
      return fail(p, DIASPORA_ERR_INVALID, "info->struct_size is smaller than sizeof(diaspora_data_info)");
    if (p->impl->closing()) return DIASPORA_ERR_CLOSED;
    HookArgs a;
    a.head.kind = Kind::data;
    DIASPORA_TRY(check_str(p, d->stream, DIASPORA_MAX_ID, true, "stream", a.strings[dp::f_key]));
    DIASPORA_TRY(check_str(p, d->uri, DIASPORA_MAX_TEXT, false, "uri", a.strings[dp::f_text]));
    DIASPORA_TRY(check_str(p, d->checksum, DIASPORA_MAX_ID, false, "checksum", a.strings[dp::f_extra]));
    DIASPORA_TRY(check_str(p, d->site, DIASPORA_MAX_ID, false, "site", a.strings[dp::f_site]));
    if (!a.strings[dp::f_extra].empty() && !checksum_ok(a.strings[dp::f_extra]))
      return fail(p, DIASPORA_ERR_INVALID, "checksum '" + std::string(a.strings[dp::f_extra]) + "' must look like <algorithm>:<hex>, e.g. crc32c:1a2b3c4d");
    if (d->seq < 0) return fail(p, DIASPORA_ERR_INVALID, "seq is negative");
    a.head.integer = d->seq;
    if (d->bytes < -1) return fail(p, DIASPORA_ERR_INVALID, "bytes must be >= 0, or -1 for unknown");
    if (d->bytes >= 0) {
      a.head.flags |= dp::has_bytes;
      a.head.integer2 = d->bytes;
    }
    DIASPORA_TRY(check_time(p, d->timestamp_us, a));
    return p->impl->enqueue(a);
  });
}

DIASPORA_API int diaspora_resource_status(diaspora_plugin* p, const diaspora_resource_info* r) {
  return guarded(p, [&]() -> int {
    if (!p || !p->impl) return DIASPORA_ERR_NULL;
    if (!r) return fail(p, DIASPORA_ERR_NULL, "info is NULL");
    if (r->struct_size < kResourceInfoV1)
      return fail(p, DIASPORA_ERR_INVALID, "info->struct_size is smaller than sizeof(diaspora_resource_info)");
    if (p->impl->closing()) return DIASPORA_ERR_CLOSED;
    HookArgs a;
    a.head.kind = Kind::resource;
    DIASPORA_TRY(check_str(p, r->resource_id, DIASPORA_MAX_ID, true, "resource_id", a.strings[dp::f_key]));
    DIASPORA_TRY(check_str(p, r->kind, DIASPORA_MAX_ID, true, "kind", a.strings[dp::f_name]));
    DIASPORA_TRY(check_str(p, r->state, DIASPORA_MAX_ID, true, "state", a.strings[dp::f_extra]));
    DIASPORA_TRY(check_str(p, r->site, DIASPORA_MAX_ID, false, "site", a.strings[dp::f_site]));
    if (!one_of(a.strings[dp::f_name], kResourceKinds))
      return fail(p, DIASPORA_ERR_INVALID, "kind '" + std::string(a.strings[dp::f_name]) + "' is not one of site, worker, node, gpu, link, relay");
    if (!one_of(a.strings[dp::f_extra], kResourceStates))
      return fail(p, DIASPORA_ERR_INVALID, "state '" + std::string(a.strings[dp::f_extra]) + "' is not one of up, degraded, down, unknown");
    DIASPORA_TRY(check_metrics(p, r->metrics, r->metric_count, a));
    DIASPORA_TRY(check_time(p, r->timestamp_us, a));
    return p->impl->enqueue(a);
  });
}

DIASPORA_API int diaspora_set_action_callback(diaspora_plugin* p, diaspora_action_callback cb, void* user) {
  if (!p || !p->impl) return DIASPORA_ERR_NULL;
  return p->impl->set_callback(cb, user);
}

DIASPORA_API int diaspora_poll_action(diaspora_plugin* p, diaspora_action* out) {
  if (!p || !p->impl) return DIASPORA_ERR_NULL;
  if (!out) return fail(p, DIASPORA_ERR_NULL, "out is NULL");
  if (out->struct_size < kActionV1)
    return fail(p, DIASPORA_ERR_INVALID, "out->struct_size is smaller than sizeof(diaspora_action) of ABI 1.0");
  return p->impl->poll_action(out);
}

static int ack(diaspora_plugin* p, const char* id, const char* msg, bool ok) noexcept {
  return guarded(p, [&]() -> int {
    if (!p || !p->impl) return DIASPORA_ERR_NULL;
    std::string_view sid, smsg;
    DIASPORA_TRY(check_str(p, id, DIASPORA_MAX_ID, true, "action_id", sid));
    DIASPORA_TRY(check_str(p, msg, DIASPORA_MAX_TEXT, !ok, ok ? "message" : "reason", smsg));
    return p->impl->ack_action(sid, ok, smsg);
  });
}

DIASPORA_API int diaspora_action_done(diaspora_plugin* p, const char* action_id, const char* message) {
  return ack(p, action_id, message, true);
}

DIASPORA_API int diaspora_action_failed(diaspora_plugin* p, const char* action_id, const char* reason) {
  return ack(p, action_id, reason, false);
}

// ---- data items (ABI 1.3) ----

static std::chrono::steady_clock::time_point item_deadline(int64_t timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 60000);
}

// What an item call's failure returns, with its reason recorded on the handle.
static int item_failure(diaspora_plugin* p, const std::exception& e) {
  if (const auto* ie = dynamic_cast<const diaspora::items::ItemError*>(&e)) {
    const int status = ie->code() == "no_item"             ? DIASPORA_ERR_NOT_FOUND
                       : ie->code() == "checksum_mismatch" || ie->code() == "incomplete_item" ? DIASPORA_ERR_IO
                                                           : DIASPORA_ERR_INVALID;
    return fail(p, status, std::string(e.what()) + " (" + ie->code() + ")");
  }
  if (dynamic_cast<const diaspora::RelayClientError*>(&e))
    return fail(p, DIASPORA_ERR_TIMEOUT, std::string("data item: the relay did not answer in time: ") + e.what());
  return fail(p, DIASPORA_ERR_INVALID, e.what());
}

DIASPORA_API int diaspora_item_put(diaspora_plugin* p, const diaspora_item_info* info, diaspora_item_ref* out) {
  return guarded(p, [&]() -> int {
    if (!p || !p->impl) return DIASPORA_ERR_NULL;
    if (!info) return fail(p, DIASPORA_ERR_NULL, "info is NULL");
    if (info->struct_size < sizeof(diaspora_item_info))
      return fail(p, DIASPORA_ERR_INVALID, "info->struct_size is smaller than sizeof(diaspora_item_info)");
    if (out && out->struct_size < sizeof(diaspora_item_ref))
      return fail(p, DIASPORA_ERR_INVALID, "out->struct_size is smaller than sizeof(diaspora_item_ref)");
    if (!info->bytes && info->size > 0) return fail(p, DIASPORA_ERR_NULL, "bytes is NULL with a size above 0");
    if (p->impl->closing()) return DIASPORA_ERR_CLOSED;
    std::string_view topic, id, type, stream, content_type, site, deadline;
    DIASPORA_TRY(check_str(p, info->topic, DIASPORA_MAX_ID, false, "topic", topic));
    DIASPORA_TRY(check_str(p, info->id, DIASPORA_MAX_ID, false, "id", id));
    DIASPORA_TRY(check_str(p, info->type, DIASPORA_MAX_ID, false, "type", type));
    DIASPORA_TRY(check_str(p, info->stream, DIASPORA_MAX_ID, false, "stream", stream));
    DIASPORA_TRY(check_str(p, info->content_type, DIASPORA_MAX_ID, false, "content_type", content_type));
    DIASPORA_TRY(check_str(p, info->site, DIASPORA_MAX_ID, false, "site", site));
    DIASPORA_TRY(check_str(p, info->deadline, DIASPORA_MAX_ID, false, "deadline", deadline));
    if (info->seq < -1) return fail(p, DIASPORA_ERR_INVALID, "seq must be >= 0, or -1 for none");
    if (!deadline.empty() && !diaspora::parse_rfc3339_us(deadline))
      return fail(p, DIASPORA_ERR_INVALID, "deadline '" + std::string(deadline) + "' is not an RFC 3339 timestamp");
    boost::json::object data;
    if (!stream.empty()) data["stream"] = stream;
    if (info->seq >= 0) data["seq"] = info->seq;
    if (!content_type.empty()) data["content_type"] = content_type;
    if (!site.empty()) data["site"] = site;
    boost::json::object event{{"specversion", "1.0"},
                              {"id", id.empty() ? diaspora::make_uuid() : std::string(id)},
                              {"source", p->impl->source()},
                              {"type", type.empty() ? std::string("org.diaspora.data.item") : std::string(type)},
                              {"time", diaspora::format_rfc3339(std::chrono::system_clock::now())},
                              {"data", std::move(data)}};
    const std::string where = topic.empty() ? p->impl->data_topic() : std::string(topic);
    diaspora::items::PutOptions po;
    if (!deadline.empty()) po.deadline = std::string(deadline);
    try {
      const auto r = p->impl->items().put(where, std::move(event),
                                          std::string_view(static_cast<const char*>(info->bytes), info->size), po,
                                          item_deadline(info->timeout_ms));
      if (out) {
        write_buf(out->topic, sizeof out->topic, where);
        out->offset = r.offset;
        out->duplicate = r.duplicate ? 1 : 0;
        out->late = r.late ? 1 : 0;
      }
      return DIASPORA_OK;
    } catch (const std::exception& e) {
      return item_failure(p, e);
    }
  });
}

DIASPORA_API int diaspora_item_get(diaspora_plugin* p, const char* topic, uint64_t offset, int64_t timeout_ms,
                                   void** bytes_out, size_t* size_out, char** event_json_out) {
  return guarded(p, [&]() -> int {
    if (!p || !p->impl) return DIASPORA_ERR_NULL;
    if (!bytes_out || !size_out) return fail(p, DIASPORA_ERR_NULL, "bytes_out and size_out are required");
    if (p->impl->closing()) return DIASPORA_ERR_CLOSED;
    std::string_view t;
    DIASPORA_TRY(check_str(p, topic, DIASPORA_MAX_ID, false, "topic", t));
    diaspora::items::Item item;
    try {
      item = p->impl->items().get(t.empty() ? p->impl->data_topic() : std::string(t), offset, item_deadline(timeout_ms));
    } catch (const std::exception& e) {
      return item_failure(p, e);
    }
    void* bytes = std::malloc(item.bytes.empty() ? 1 : item.bytes.size());
    char* text = nullptr;
    if (event_json_out) {
      const std::string ev = boost::json::serialize(item.event);
      text = static_cast<char*>(std::malloc(ev.size() + 1));
      if (text) std::memcpy(text, ev.c_str(), ev.size() + 1);
    }
    if (!bytes || (event_json_out && !text)) {
      std::free(bytes);
      std::free(text);
      return fail(p, DIASPORA_ERR_INTERNAL, "out of memory for an item of " + std::to_string(item.bytes.size()) + " bytes");
    }
    if (!item.bytes.empty()) std::memcpy(bytes, item.bytes.data(), item.bytes.size());
    *bytes_out = bytes;
    *size_out = item.bytes.size();
    if (event_json_out) *event_json_out = text;
    return DIASPORA_OK;
  });
}

DIASPORA_API void diaspora_item_free(void* ptr) { std::free(ptr); }

DIASPORA_API int diaspora_get_stats(const diaspora_plugin* p, diaspora_stats* out) {
  if (!p || !p->impl || !out) return DIASPORA_ERR_NULL;
  if (out->struct_size < kStatsV1) return DIASPORA_ERR_INVALID;
  const size_t size = out->struct_size;
  std::memset(out, 0, sizeof(diaspora_stats));
  out->struct_size = size;
  p->impl->stats(*out);
  return DIASPORA_OK;
}

}  // extern "C"
