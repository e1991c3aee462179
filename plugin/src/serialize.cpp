#include "serialize.hpp"

#include "diaspora/plugin.h"
#include "diaspora/utf8.hpp"

#include <boost/json/serialize.hpp>

#include <charconv>
#include <chrono>
#include <ctime>

namespace diaspora::plugin {

namespace {

constexpr std::string_view type_name(Kind k) noexcept {
  switch (k) {
    case Kind::submitted: return "org.diaspora.task.submitted";
    case Kind::started: return "org.diaspora.task.started";
    case Kind::heartbeat: return "org.diaspora.task.heartbeat";
    case Kind::progress: return "org.diaspora.task.progress";
    case Kind::completed: return "org.diaspora.task.completed";
    case Kind::failed: return "org.diaspora.task.failed";
    case Kind::cancelled: return "org.diaspora.task.cancelled";
    case Kind::metric: return "org.diaspora.metric";
    case Kind::data: return "org.diaspora.data.arrived";
    case Kind::resource: return "org.diaspora.resource.status";
  }
  return "org.diaspora.unknown";
}

constexpr std::string_view scope_name(std::uint8_t s) noexcept {
  switch (s) {
    case 1: return "task";
    case 2: return "site";
    default: return "resource";
  }
}

void append_double(std::string& out, double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

// Writes `,"key":` (the caller has opened the object and written at least one member).
void key(std::string& out, std::string_view k) {
  out += ",\"";
  out += k;
  out += "\":";
}

void str_member(std::string& out, std::string_view k, std::string_view v) {
  if (v.empty()) return;
  key(out, k);
  append_json_string(out, v);
}

void metrics_member(std::string& out, const RecordView& r) {
  if (r.head->metric_count == 0) return;
  key(out, "metrics");
  out += '{';
  bool first = true;
  r.for_each_metric([&](std::string_view name, double v) {
    if (!first) out += ',';
    first = false;
    out += '"';
    out += name;  // validated by the hook: [A-Za-z0-9_.:-]
    out += "\":";
    append_double(out, v);
  });
  out += '}';
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  std::size_t run = 0;  // start of the pending run of bytes copied as they are
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      if (std::size_t n = utf8_sequence_length(s, i)) {
        i += n;
        continue;
      }
    }
    out.append(s.data() + run, i - run);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += "\xEF\xBF\xBD";  // U+FFFD for a byte that does not start valid UTF-8
        }
    }
    ++i;
    run = i;
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

void append_time(std::string& out, std::int64_t time_us) {
  // Formatting the date part costs a gmtime_r; consecutive events mostly share the second.
  thread_local std::int64_t cached_sec = -1;
  thread_local char cached[20];
  std::int64_t sec = time_us / 1000000, usec = time_us % 1000000;
  if (usec < 0) {
    usec += 1000000;
    --sec;
  }
  if (sec != cached_sec) {
    std::time_t t = static_cast<std::time_t>(sec);
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(cached, sizeof cached, "%Y-%m-%dT%H:%M:%S", &tm);
    cached_sec = sec;
  }
  char frac[8];
  frac[0] = '.';
  for (int k = 6; k >= 1; --k) {
    frac[k] = static_cast<char>('0' + usec % 10);
    usec /= 10;
  }
  frac[7] = 'Z';
  out += '"';
  out.append(cached, 19);
  out.append(frac, 8);
  out += '"';
}

namespace {

void envelope(std::string& out, std::string_view type, std::string_view id, std::optional<std::string_view> subject,
              const EventContext& ctx, std::int64_t time_us) {
  out += "{\"specversion\":\"1.0\",\"id\":";
  append_json_string(out, id);
  out += ",\"source\":";
  append_json_string(out, ctx.source);
  out += ",\"type\":\"";
  out += type;
  out += "\",\"time\":";
  append_time(out, time_us);
  if (subject && !subject->empty()) {
    out += ",\"subject\":";
    append_json_string(out, *subject);
  }
  out += ",\"datacontenttype\":\"application/json\",\"data\":";
}

}  // namespace

void append_event(std::string& out, const RecordView& r, std::string_view id, const EventContext& ctx,
                  const Derived& d) {
  const RecordHead& h = *r.head;
  envelope(out, type_name(h.kind), id, r.str(f_key), ctx, h.time_us);
  switch (h.kind) {
    case Kind::metric:
      out += "{\"scope\":\"";
      out += scope_name(h.scope);
      out += "\",\"id\":";
      append_json_string(out, r.str(f_key));
      out += ",\"name\":\"";
      out += r.str(f_name);
      out += "\",\"value\":";
      append_double(out, h.number);
      if (d.coalesced > 0) {
        key(out, "count");
        append_int(out, static_cast<std::int64_t>(d.coalesced) + 1);
      }
      str_member(out, "site", r.str(f_site));
      out += "}}";
      return;
    case Kind::data:
      out += "{\"stream\":";
      append_json_string(out, r.str(f_key));
      key(out, "seq");
      append_int(out, h.integer);
      if (h.flags & has_bytes) {
        key(out, "bytes");
        append_int(out, h.integer2);
      }
      str_member(out, "uri", r.str(f_text));
      str_member(out, "checksum", r.str(f_extra));
      str_member(out, "site", r.str(f_site));
      out += "}}";
      return;
    case Kind::resource:
      out += "{\"resource_id\":";
      append_json_string(out, r.str(f_key));
      str_member(out, "kind", r.str(f_name));
      str_member(out, "state", r.str(f_extra));
      str_member(out, "site", r.str(f_site));
      metrics_member(out, r);
      out += "}}";
      return;
    default:
      break;
  }
  // Task events: the TaskRef fields, then the kind's own.
  out += "{\"task_id\":";
  append_json_string(out, r.str(f_key));
  str_member(out, "workflow", ctx.workflow);
  str_member(out, "site", r.str(f_site));
  if (h.attempt > 0) {
    key(out, "attempt");
    append_int(out, h.attempt);
  }
  switch (h.kind) {
    case Kind::submitted:
      str_member(out, "name", r.str(f_name));
      if (h.flags & has_deadline) {
        key(out, "deadline_s");
        append_double(out, h.number);
      }
      break;
    case Kind::started:
      str_member(out, "worker", r.str(f_worker));
      if (d.queue_wait_s) {
        key(out, "queue_wait_s");
        append_double(out, *d.queue_wait_s);
      }
      break;
    case Kind::heartbeat:
      str_member(out, "worker", r.str(f_worker));
      if (d.heartbeat_seq >= 0) {
        key(out, "seq");
        append_int(out, d.heartbeat_seq);
      }
      metrics_member(out, r);
      break;
    case Kind::progress:
      key(out, "progress");
      append_double(out, h.number);
      str_member(out, "worker", r.str(f_worker));
      if (h.flags & has_step) {
        key(out, "step");
        append_int(out, h.integer);
      }
      metrics_member(out, r);
      break;
    case Kind::completed:
    case Kind::failed:
      if (h.kind == Kind::failed) {
        key(out, "reason");
        append_json_string(out, r.str(f_text));
      }
      str_member(out, "worker", r.str(f_worker));
      if (h.flags & has_exit_code) {
        key(out, "exit_code");
        append_int(out, h.exit_code);
      }
      if (h.kind == Kind::failed && (h.flags & retryable)) out += ",\"retryable\":true";
      if (h.kind == Kind::failed && h.integer == DIASPORA_FAILURE_ERROR) out += ",\"failure\":\"error\"";
      if (h.kind == Kind::failed && h.integer == DIASPORA_FAILURE_LOST) out += ",\"failure\":\"lost\"";
      if (d.runtime_s) {
        key(out, "runtime_s");
        append_double(out, *d.runtime_s);
      }
      break;
    case Kind::cancelled:
      str_member(out, "reason", r.str(f_text));
      break;
    default:
      break;
  }
  out += "}}";
}

void append_event(std::string& out, std::string_view type, std::string_view id, std::optional<std::string_view> subject,
                  const boost::json::object& data, const EventContext& ctx, std::int64_t time_us) {
  envelope(out, type, id, subject, ctx, time_us);
  out += boost::json::serialize(data);
  out += '}';
}

}  // namespace diaspora::plugin
