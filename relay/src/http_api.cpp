#include "http_api.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "diaspora/event.hpp"
#include "diaspora/utf8.hpp"
#include "topic_browse.hpp"

namespace diaspora::relay {

namespace json = boost::json;

namespace {

std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

json::object topic_json(const TopicInfo& i) {
  return json::object{{"name", i.name},
                      {"first_offset", i.first_offset},
                      {"next_offset", i.next_offset},
                      {"bytes", i.bytes},
                      {"segments", i.segments},
                      {"retention_bytes", i.retention_bytes},
                      {"retention_age_s", i.retention_age_s}};
}

HttpReply text(unsigned status, std::string body, bool challenge = false) {
  return HttpReply{status, "text/plain", std::move(body), challenge, {}};
}

// Strings in a reply may hold bytes of the request (a percent-decoded name in a refusal),
// which Boost.JSON copies as they are: invalid UTF-8 becomes U+FFFD, so that the reply is
// JSON (found by tests/fuzz/fuzz_http.cpp). Outside strings, serialized JSON is ASCII.
HttpReply json_reply(unsigned status, const json::object& o) {
  return HttpReply{status, "application/json", valid_utf8(json::serialize(o)) + "\n", false, {}};
}

bool is_admin(const TokenClaims& c) { return std::find(c.scopes.begin(), c.scopes.end(), "admin") != c.scopes.end(); }

// What an event the relay makes for an operator names as its source: /diaspora/console/
// and the token's subject, its characters outside [A-Za-z0-9._-] as '_'.
std::string console_source(const TokenClaims& claims) {
  std::string who = claims.subject;
  for (char& c : who)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  return "/diaspora/console/" + who;
}

// The refusal to give when the request lacks an admin token; nullopt when it has one.
std::optional<HttpReply> refuse_unless_admin(const std::optional<std::string>& bearer, const ApiContext& ctx) {
  if (!bearer) {
    ctx.metrics.refused_auth++;
    return text(401, "a bearer token with the 'admin' scope is required\n", true);
  }
  try {
    auto c = ctx.verifier.verify(*bearer);
    if (!is_admin(c)) {
      ctx.metrics.refused_auth++;
      return text(403, "token of '" + c.subject + "' lacks the 'admin' scope\n");
    }
  } catch (const TokenError& e) {
    ctx.metrics.refused_auth++;
    return text(401, std::string(e.what()) + "\n", true);
  }
  return std::nullopt;
}

// A JSON refusal {"error": code, "message": ...}; a 401 challenges for a bearer token.
HttpReply json_error(unsigned status, const char* code, const std::string& message) {
  HttpReply r = json_reply(status, json::object{{"error", code}, {"message", message}});
  r.challenge = status == 401;
  return r;
}

// The claims of a valid bearer token, or the 401 to answer (`missing` says what is needed).
std::variant<TokenClaims, HttpReply> verify_bearer(const std::optional<std::string>& bearer, const ApiContext& ctx,
                                                   const std::string& missing) {
  if (!bearer || bearer->empty()) {
    ctx.metrics.refused_auth++;
    return json_error(401, "unauthorized", missing);
  }
  try {
    return ctx.verifier.verify(*bearer);
  } catch (const TokenError& e) {
    ctx.metrics.refused_auth++;
    return json_error(401, "unauthorized", e.what());
  }
}

// GET /api/v1/views/<view>: any valid token; it sees the workflows whose events topic it may
// subscribe to ("admin" sees everything).
HttpReply handle_views(const std::string& view, const Target& target, const std::optional<std::string>& bearer,
                       const ApiContext& ctx) {
  auto verified = verify_bearer(bearer, ctx, "a bearer token is required (any token; it sees the workflows it may subscribe to)");
  if (auto* refusal = std::get_if<HttpReply>(&verified)) return *refusal;
  const TokenClaims& claims = std::get<TokenClaims>(verified);
  if (!ctx.views) return json_error(404, "views_off", "this relay runs without views (views: false in its configuration)");
  auto may_read = [&](const std::string& wf) { return scopes_allow(claims.scopes, "subscribe", wf + ".events"); };
  try {
    return json_reply(200, ctx.views->query(view, target.query, may_read));
  } catch (const ViewQueryError& e) {
    const bool unknown_view = std::string_view(e.what()).starts_with("no view '");
    return json_error(unknown_view ? 404 : 400, unknown_view ? "not_found" : "bad_request", e.what());
  }
}

// GET /api/v1/topics[/{topic}[/events]]: any valid token; it sees the topics it may
// subscribe to ("admin" sees every one), and nothing is refused that it may read.
HttpReply handle_topics(const std::string& path, const Target& target, const std::optional<std::string>& bearer,
                        const ApiContext& ctx) {
  auto verified = verify_bearer(bearer, ctx, "a bearer token is required (any token; it sees the topics it may subscribe to)");
  if (auto* refusal = std::get_if<HttpReply>(&verified)) return *refusal;
  const TokenClaims& claims = std::get<TokenClaims>(verified);
  auto may_read = [&](const std::string& topic) { return scopes_allow(claims.scopes, "subscribe", topic); };
  if (path == "/api/v1/topics") {
    json::array out;
    for (const auto& t : ctx.store.topics())
      if (may_read(t))
        if (auto i = ctx.store.info(t)) out.push_back(topic_json(*i));
    return json_reply(200, json::object{{"topics", out}});
  }
  std::string name = path.substr(std::string("/api/v1/topics/").size());
  const bool events = name.ends_with("/events");
  if (events) name.resize(name.size() - std::string("/events").size());
  auto info = valid_topic_name(name) ? ctx.store.info(name) : std::nullopt;
  if (info && !may_read(name)) {
    ctx.metrics.refused_auth++;
    return json_error(403, "forbidden", "token of '" + claims.subject + "' may not subscribe to '" + name + "'");
  }
  if (!info) return json_error(404, "not_found", "no topic '" + name + "'");
  if (events) {
    BrowseRequest rq;
    try {
      rq = parse_browse(target.query);
    } catch (const BrowseError& e) {
      return json_error(400, "bad_request", e.what());
    }
    const BrowseResult r = browse(ctx.store, name, rq);
    HttpReply reply{200, "application/json", render_browse(name, rq, r), false, {}};
    if (rq.format != BrowseFormat::json) {
      const char* ext = rq.format == BrowseFormat::csv ? "csv" : "jsonl";
      reply.content_type = rq.format == BrowseFormat::csv ? "text/csv; charset=utf-8" : "application/x-ndjson";
      const std::string range = r.scanned_low ? std::to_string(*r.scanned_low) + "-" + std::to_string(*r.scanned_high) : "none";
      reply.headers = {{"Content-Disposition", "attachment; filename=\"" + name + "-" + range + "." + ext + "\""},
                       {"X-Diaspora-Scanned", range + "; records=" + std::to_string(r.records)},
                       {"X-Diaspora-Next", r.next ? std::to_string(*r.next) : std::string("none")}};
    }
    return reply;
  }
  json::object o = topic_json(*info);
  json::array groups;
  for (const auto& [g, t, off] : ctx.store.group_offsets())
    if (t == name)
      groups.push_back(json::object{{"group", g}, {"offset", off}, {"lag", info->next_offset > off ? info->next_offset - off : 0}});
  o["groups"] = std::move(groups);
  return json_reply(200, o);
}

// A file of the console's built assets. Names are plain ([A-Za-z0-9._-] segments, none
// starting with '.'), so nothing outside the folder can be named.
HttpReply serve_console(std::string rel, const ApiContext& ctx) {
  if (rel.empty()) rel = "index.html";
  auto plain = [](std::string_view seg) {
    return !seg.empty() && seg[0] != '.' &&
           std::all_of(seg.begin(), seg.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; });
  };
  std::string_view rest = rel;
  while (!rest.empty()) {
    const auto slash = rest.find('/');
    if (!plain(rest.substr(0, slash))) return text(404, "not found\n");
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
  }
  if (ctx.console_dir.empty() || !std::filesystem::exists(ctx.console_dir / "index.html"))
    return text(404, "this relay has no console assets (build them: make build with Node installed, "
                     "or set console_dir in the relay's configuration)\n");
  std::ifstream f(ctx.console_dir / rel, std::ios::binary);
  if (!f || std::filesystem::is_directory(ctx.console_dir / rel)) return text(404, "not found: /console/" + rel + "\n");
  std::stringstream body;
  body << f.rdbuf();
  static const std::map<std::string, std::string> types = {
      {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
      {".svg", "image/svg+xml"}, {".png", "image/png"}, {".json", "application/json"}, {".map", "application/json"},
      {".woff2", "font/woff2"}, {".txt", "text/plain; charset=utf-8"}};
  const std::string ext = std::filesystem::path(rel).extension().string();
  auto t = types.find(ext);
  HttpReply r{200, t == types.end() ? "application/octet-stream" : t->second, body.str(), false, {}};
  r.headers = console_headers();
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& console_headers() {
  static const std::vector<std::pair<std::string, std::string>> h = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      {"X-Frame-Options", "DENY"},
      {"Cross-Origin-Opener-Policy", "same-origin"}};
  return h;
}

std::variant<HttpReply, OperatorAction> prepare_operator_action(std::string_view body,
                                                                const std::optional<std::string>& bearer,
                                                                const ApiContext& ctx) {
  auto verified = verify_bearer(bearer, ctx, "a bearer token with the admin or control:<workflow> scope is required");
  if (auto* refusal = std::get_if<HttpReply>(&verified)) return *refusal;
  const TokenClaims& claims = std::get<TokenClaims>(verified);
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return json_error(400, "bad_request", "the body must be a JSON object (" + (ec ? ec.message() : std::string("not an object")) + ")");
  const json::object& o = v.get_object();
  static const std::vector<std::string> keys = {"workflow", "action", "task_id", "site", "target_site", "reason", "engine"};
  for (const auto& [k, _] : o)
    if (k != "dry_run" && std::find(keys.begin(), keys.end(), std::string(k)) == keys.end())
      return json_error(400, "bad_request", "unknown field '" + std::string(k) + "' (fields: workflow, action, task_id, site, target_site, reason, engine, dry_run)");
  const json::value* dry = o.if_contains("dry_run");
  if (dry && !dry->is_bool()) return json_error(400, "bad_request", "'dry_run' must be true or false");
  std::map<std::string, std::string> f;
  for (const auto& k : keys) {
    const json::value* x = o.if_contains(k);
    if (!x) continue;
    if (!x->is_string() || x->get_string().empty() || x->get_string().size() > (k == "reason" ? 500u : 200u))
      return json_error(400, "bad_request", "'" + k + "' must be a string of 1 to " + (k == "reason" ? "500" : "200") + " characters");
    f[k] = std::string(x->get_string());
  }
  for (const char* k : {"workflow", "action", "reason"})
    if (!f.count(k)) return json_error(400, "bad_request", std::string("'") + k + "' is required");
  const std::string& wf = f["workflow"];
  if (!valid_topic_name(wf + ".events")) return json_error(400, "bad_request", "'workflow' must be a topic prefix ([A-Za-z0-9._-])");
  static const std::vector<std::string> actions = {"restart", "migrate", "speculate", "checkpoint", "throttle", "cancel",
                                                    "drain", "undrain", "alert"};
  if (std::find(actions.begin(), actions.end(), f["action"]) == actions.end())
    return json_error(400, "bad_request", "'action' must be one of restart, migrate, speculate, checkpoint, throttle, cancel, drain, undrain, alert");
  if (f["action"] == "migrate" && !f.count("target_site")) return json_error(400, "bad_request", "a migrate needs 'target_site'");
  const bool site_action = f["action"] == "drain" || f["action"] == "undrain";
  if (site_action && !f.count("site")) return json_error(400, "bad_request", "a " + f["action"] + " needs 'site'");
  bool allowed = false;
  for (const auto& s : claims.scopes)
    allowed |= s == "admin" || (s.starts_with("control:") && topic_matches(std::string_view(s).substr(8), wf));
  if (!allowed) {
    ctx.metrics.refused_auth++;
    return json_error(403, "forbidden", "token of '" + claims.subject + "' may not act on workflow '" + wf +
                                      "' (it needs the admin or control:" + wf + " scope)");
  }
  std::string engine = f.count("engine") ? f["engine"] : std::string();
  if (engine.empty() && f.count("task_id") && ctx.views) engine = ctx.views->engine_of(wf, f["task_id"]);
  if (engine.empty() && site_action && ctx.views) engine = ctx.views->engine_of_site(wf, f["site"]);
  if (engine.empty())
    return json_error(404, "not_found", f.count("task_id") ? "no engine is known for task '" + f["task_id"] + "' of '" + wf + "' (name it: 'engine')"
                                        : site_action ? "no engine is known for site '" + f["site"] + "' of '" + wf + "' (name it: 'engine')"
                                                      : std::string("name the engine ('engine') the action is for"));
  if (!valid_topic_name(wf + ".control." + engine)) return json_error(400, "bad_request", "'engine' must be an engine id ([A-Za-z0-9._-])");
  OperatorAction a;
  a.action_id = "op-" + make_uuid();
  a.topic = wf + ".control." + engine;
  a.dry_run = dry && dry->get_bool();
  json::object data{{"action_id", a.action_id}, {"action", f["action"]}, {"reason", f["reason"]}};
  for (const char* k : {"task_id", "site", "target_site"})
    if (f.count(k)) data[k] = f[k];
  const std::string id = make_uuid(), source = console_source(claims);
  json::object ev{{"specversion", "1.0"}, {"id", id}, {"source", source}, {"type", "org.diaspora.action.requested"},
                  {"time", format_rfc3339(std::chrono::system_clock::now())}, {"data", std::move(data)}};
  if (f.count("task_id")) ev["subject"] = f["task_id"];
  a.payload = json::serialize(ev);
  a.dedupe_key = source + '\x1f' + id;
  return a;
}

std::variant<HttpReply, OperatorAction> prepare_republish(std::string_view path, std::string_view body,
                                                          const std::optional<std::string>& bearer, const ApiContext& ctx) {
  auto verified = verify_bearer(bearer, ctx, "a bearer token is required (admin, or publish on the topic and subscribe on the source)");
  if (auto* refusal = std::get_if<HttpReply>(&verified)) return *refusal;
  const TokenClaims& claims = std::get<TokenClaims>(verified);
  constexpr std::string_view prefix = "/api/v1/topics/", suffix = "/republish";
  const std::string topic(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()));
  if (!valid_topic_name(topic)) return json_error(400, "bad_request", "the topic name must be 1-200 characters of [A-Za-z0-9._-]");
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return json_error(400, "bad_request", "the body must be a JSON object: {\"offset\", \"from_topic\"}");
  const json::object& o = v.get_object();
  for (const auto& [k, x] : o)
    if (k != "offset" && k != "from_topic")
      return json_error(400, "bad_request", "unknown field '" + std::string(k) + "' (known: offset, from_topic)");
  std::string from = topic;
  if (const json::value* f = o.if_contains("from_topic")) {
    if (!f->is_string() || !valid_topic_name(f->get_string())) return json_error(400, "bad_request", "'from_topic' must be a topic name");
    from = std::string(f->get_string());
  }
  const json::value* off = o.if_contains("offset");
  if (!off || !(off->is_uint64() || (off->is_int64() && off->get_int64() >= 0)))
    return json_error(400, "bad_request", "'offset' is required: the offset of the event to publish again");
  if (!is_admin(claims) && !(scopes_allow(claims.scopes, "publish", topic) && scopes_allow(claims.scopes, "subscribe", from))) {
    ctx.metrics.refused_auth++;
    return json_error(403, "forbidden", "token of '" + claims.subject + "' may not republish from '" + from + "' to '" + topic +
                                            "' (it needs admin, or publish:" + topic + " and subscribe:" + from + ")");
  }
  const std::uint64_t offset = off->to_number<std::uint64_t>();
  auto recs = ctx.store.read(from, offset, 1, 64u << 20);
  if (recs.empty() || recs.front().offset != offset)
    return json_error(404, "not_found", "nothing is stored at offset " + std::to_string(offset) + " of '" + from + "' (it holds " +
                                            std::to_string(ctx.store.first_offset(from)) + " to " +
                                            std::to_string(ctx.store.committed_offset(from)) + ", its end)");
  json::value stored = json::parse(recs.front().payload, ec);
  if (ec || !stored.is_object()) return json_error(500, "storage_error", "the stored event does not parse");
  json::object ev = std::move(stored.get_object());
  OperatorAction a;
  a.action_id = make_uuid();
  a.topic = topic;
  ev["originalid"] = ev["id"];
  ev["originalsource"] = ev["source"];
  ev["republishedfrom"] = from + "/" + std::to_string(offset);
  ev["id"] = a.action_id;
  ev["source"] = console_source(claims);
  a.payload = json::serialize(ev);
  try {
    (void)decode_event(a.payload);  // still a valid CloudEvent
  } catch (const std::exception& e) {
    return json_error(500, "internal_error", std::string("the copy is not a valid event: ") + e.what());
  }
  a.dedupe_key = std::string(ev["source"].get_string()) + '\x1f' + a.action_id;
  return a;
}

std::variant<HttpReply, GroupReset> prepare_group_reset(std::string_view path, std::string_view body,
                                                        const std::optional<std::string>& bearer, const ApiContext& ctx) {
  auto verified = verify_bearer(bearer, ctx, "a bearer token with the admin scope is required");
  if (auto* refusal = std::get_if<HttpReply>(&verified)) return *refusal;
  const TokenClaims& claims = std::get<TokenClaims>(verified);
  if (!is_admin(claims)) {
    ctx.metrics.refused_auth++;
    return json_error(403, "forbidden", "token of '" + claims.subject + "' lacks the 'admin' scope a group reset needs");
  }
  constexpr std::string_view prefix = "/api/v1/groups/", suffix = "/reset";
  GroupReset g;
  g.group = std::string(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()));
  if (!valid_topic_name(g.group)) return json_error(400, "bad_request", "the group name must be 1-200 characters of [A-Za-z0-9._-]");
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return json_error(400, "bad_request", "the body must be a JSON object: {\"topic\", \"offset\" or \"time\"}");
  const json::object& o = v.get_object();
  for (const auto& [k, x] : o)
    if (k != "topic" && k != "offset" && k != "time")
      return json_error(400, "bad_request", "unknown field '" + std::string(k) + "' (known: topic, offset, time)");
  const json::value* t = o.if_contains("topic");
  if (!t || !t->is_string() || !valid_topic_name(t->get_string()))
    return json_error(400, "bad_request", "'topic' is required: a topic name");
  g.topic = std::string(t->get_string());
  auto info = ctx.store.info(g.topic);
  if (!info) return json_error(404, "not_found", "no topic '" + g.topic + "'");
  const json::value* off = o.if_contains("offset");
  const json::value* time = o.if_contains("time");
  if ((off == nullptr) == (time == nullptr)) return json_error(400, "bad_request", "give one of 'offset' and 'time'");
  if (time) {
    auto us = time->is_string() ? parse_rfc3339_us(time->get_string()) : std::nullopt;
    if (!us) return json_error(400, "bad_request", "'time' must be an RFC 3339 time (2026-12-06T10:00:00Z)");
    g.offset = ctx.store.offset_at_time(g.topic, *us);
  } else if (off->is_string() && (off->get_string() == "earliest" || off->get_string() == "latest")) {
    g.offset = off->get_string() == "earliest" ? info->first_offset : info->next_offset;
  } else if (off->is_uint64() || (off->is_int64() && off->get_int64() >= 0)) {
    g.offset = off->to_number<std::uint64_t>();
    if (g.offset < info->first_offset || g.offset > info->next_offset)
      return json_error(400, "bad_request", "offset " + std::to_string(g.offset) + " is outside what '" + g.topic +
                                                "' holds: " + std::to_string(info->first_offset) + " to " +
                                                std::to_string(info->next_offset) + " (its end)");
  } else {
    return json_error(400, "bad_request", "'offset' must be a non-negative number, \"earliest\" or \"latest\"");
  }
  g.previous = ctx.store.group_offset(g.group, g.topic);
  return g;
}

Target parse_target(std::string_view t) {
  Target out;
  auto q = t.find('?');
  out.path = percent_decode(t.substr(0, q));
  if (q == std::string_view::npos) return out;
  std::string_view rest = t.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    std::string_view kv = rest.substr(0, amp);
    auto eq = kv.find('=');
    out.query[percent_decode(kv.substr(0, eq))] = eq == std::string_view::npos ? "" : percent_decode(kv.substr(eq + 1));
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
  }
  return out;
}

std::optional<std::string> bearer_token(std::optional<std::string_view> v) {
  if (!v) return std::nullopt;
  if (v->size() > 7 && (v->substr(0, 7) == "Bearer " || v->substr(0, 7) == "bearer ")) return std::string(v->substr(7));
  return std::string();
}

namespace {

HttpReply route(bool get_or_head, std::string_view raw_target, const std::optional<std::string>& bearer,
                const ApiContext& ctx) {
  const Target target = parse_target(raw_target);
  const std::string& path = target.path;
  if (!get_or_head) return text(405, "only GET is supported\n");
  if (path == "/healthz") return text(200, "ok\n");
  if (path == "/readyz") {
    if (ctx.stopping) return text(503, "shutting down\n");
    if (auto why = ctx.store.unready()) return text(503, *why + "\n");
    return text(200, "ready\n");
  }
  if (path == "/metrics") {
    if (!ctx.public_metrics)
      if (auto refusal = refuse_unless_admin(bearer, ctx)) return *refusal;
    return HttpReply{200, "text/plain; version=0.0.4", render_metrics(ctx.metrics, ctx.store), false, {}};
  }
  if (path == "/api/v1/topics" || path.starts_with("/api/v1/topics/")) return handle_topics(path, target, bearer, ctx);
  if (path.starts_with("/api/v1/views/")) return handle_views(path.substr(std::string("/api/v1/views/").size()), target, bearer, ctx);
  if (path == "/console") {
    HttpReply r = text(301, "the console is at /console/\n");
    r.headers = {{"Location", "/console/"}};
    return r;
  }
  if (path.starts_with("/console/")) return serve_console(path.substr(std::string("/console/").size()), ctx);
  return text(404, "not found: " + path + "\n");
}

}  // namespace

HttpReply handle_http(bool get_or_head, std::string_view raw_target, const std::optional<std::string>& bearer,
                      const ApiContext& ctx) {
  try {
    return route(get_or_head, raw_target, bearer, ctx);
  } catch (const Error& e) {  // the store cannot be read now (a cluster out of reach): said, nothing else lost
    return json_error(503, "storage_error", e.what());
  }
}

}  // namespace diaspora::relay
