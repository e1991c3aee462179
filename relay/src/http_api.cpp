#include "http_api.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <cctype>

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
                      {"segments", i.segments}};
}

HttpReply text(unsigned status, std::string body, bool challenge = false) {
  return HttpReply{status, "text/plain", std::move(body), challenge};
}

HttpReply json_reply(unsigned status, const json::object& o) {
  return HttpReply{status, "application/json", json::serialize(o) + "\n", false};
}

// The refusal to give when the request lacks an admin token; nullopt when it has one.
std::optional<HttpReply> refuse_unless_admin(const std::optional<std::string>& bearer, const ApiContext& ctx) {
  if (!bearer) {
    ctx.metrics.refused_auth++;
    return text(401, "a bearer token with the 'admin' scope is required\n", true);
  }
  try {
    auto c = ctx.verifier.verify(*bearer);
    if (std::find(c.scopes.begin(), c.scopes.end(), "admin") == c.scopes.end()) {
      ctx.metrics.refused_auth++;
      return text(403, "token of '" + c.subject + "' lacks the 'admin' scope\n");
    }
  } catch (const TokenError& e) {
    ctx.metrics.refused_auth++;
    return text(401, std::string(e.what()) + "\n", true);
  }
  return std::nullopt;
}

// GET /api/v1/views/<view>: any valid token; it sees the workflows whose events topic it may
// subscribe to ("admin" sees everything).
HttpReply handle_views(const std::string& view, const Target& target, const std::optional<std::string>& bearer,
                       const ApiContext& ctx) {
  auto error = [](unsigned status, const char* code, const std::string& message) {
    HttpReply r = json_reply(status, json::object{{"error", code}, {"message", message}});
    r.challenge = status == 401;
    return r;
  };
  if (!bearer || bearer->empty()) {
    ctx.metrics.refused_auth++;
    return error(401, "unauthorized", "a bearer token is required (any token; it sees the workflows it may subscribe to)");
  }
  TokenClaims claims;
  try {
    claims = ctx.verifier.verify(*bearer);
  } catch (const TokenError& e) {
    ctx.metrics.refused_auth++;
    return error(401, "unauthorized", e.what());
  }
  if (!ctx.views) return error(404, "views_off", "this relay runs without views (views: false in its configuration)");
  auto may_read = [&](const std::string& wf) { return scopes_allow(claims.scopes, "subscribe", wf + ".events"); };
  try {
    return json_reply(200, ctx.views->query(view, target.query, may_read));
  } catch (const ViewQueryError& e) {
    const bool unknown_view = std::string_view(e.what()).starts_with("no view '");
    return error(unknown_view ? 404 : 400, unknown_view ? "not_found" : "bad_request", e.what());
  }
}

}  // namespace

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

HttpReply handle_http(bool get_or_head, std::string_view raw_target, const std::optional<std::string>& bearer,
                      const ApiContext& ctx) {
  const Target target = parse_target(raw_target);
  const std::string& path = target.path;
  if (!get_or_head) return text(405, "only GET is supported\n");
  if (path == "/healthz") return text(200, "ok\n");
  if (path == "/readyz") return ctx.stopping ? text(503, "shutting down\n") : text(200, "ready\n");
  if (path == "/metrics") {
    if (!ctx.public_metrics)
      if (auto refusal = refuse_unless_admin(bearer, ctx)) return *refusal;
    return HttpReply{200, "text/plain; version=0.0.4", render_metrics(ctx.metrics, ctx.store), false};
  }
  if (path == "/api/v1/topics" || path.starts_with("/api/v1/topics/")) {
    if (auto refusal = refuse_unless_admin(bearer, ctx)) return *refusal;
    if (path == "/api/v1/topics") {
      json::array out;
      for (const auto& t : ctx.store.topics())
        if (auto i = ctx.store.info(t)) out.push_back(topic_json(*i));
      return json_reply(200, json::object{{"topics", out}});
    }
    std::string name = path.substr(std::string("/api/v1/topics/").size());
    auto info = valid_topic_name(name) ? ctx.store.info(name) : std::nullopt;
    if (!info) return json_reply(404, json::object{{"error", "not_found"}, {"message", "no topic '" + name + "'"}});
    json::object o = topic_json(*info);
    json::array groups;
    for (const auto& [g, t, off] : ctx.store.group_offsets())
      if (t == name)
        groups.push_back(json::object{{"group", g}, {"offset", off}, {"lag", info->next_offset > off ? info->next_offset - off : 0}});
    o["groups"] = std::move(groups);
    return json_reply(200, o);
  }
  if (path.starts_with("/api/v1/views/")) return handle_views(path.substr(std::string("/api/v1/views/").size()), target, bearer, ctx);
  return text(404, "not found: " + path + "\n");
}

}  // namespace diaspora::relay
