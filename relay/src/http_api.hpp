// The relay's plain HTTPS endpoints (/healthz, /readyz, /metrics, /api/v1/...), kept apart
// from the Beast session code in server.cpp: requests and replies here are plain values.
// Internal to the relay. Thread safety: pure functions of their arguments; handle_http()
// reads the store and updates the metrics, both safe from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "diaspora/token.hpp"
#include "metrics.hpp"
#include "store.hpp"
#include "views.hpp"

namespace diaspora::relay {

/// A request target split into its percent-decoded path and query parameters.
struct Target {
  std::string path;
  std::map<std::string, std::string> query;
};
Target parse_target(std::string_view target);

/// The token of an Authorization header: nullopt when there is none, "" when it is not a
/// bearer token (then refused as malformed).
std::optional<std::string> bearer_token(std::optional<std::string_view> authorization);

/// What to answer.
struct HttpReply {
  unsigned status = 200;
  std::string content_type = "text/plain";
  std::string body;
  bool challenge = false;  ///< add WWW-Authenticate: Bearer
  std::vector<std::pair<std::string, std::string>> headers;  ///< more response headers
};

/// What the endpoints read.
struct ApiContext {
  const Store& store;
  const TokenVerifier& verifier;
  Metrics& metrics;
  bool public_metrics = true;
  bool stopping = false;
  const Views* views = nullptr;  ///< nullptr: the views are off (views: false)
  std::filesystem::path console_dir;  ///< the console's built assets; empty: none
};

/// Answers a request that is not a WebSocket upgrade. `get_or_head` is false for any other
/// method (405). Refusals count in metrics.refused_auth.
HttpReply handle_http(bool get_or_head, std::string_view target, const std::optional<std::string>& bearer,
                      const ApiContext& ctx);

/// An operator's action, checked and ready to append: the event for the engine's control
/// topic (docs/console.md, "Operator actions").
struct OperatorAction {
  std::string topic;       ///< <workflow>.control.<engine>
  std::string payload;     ///< the org.diaspora.action.requested CloudEvent (JSON)
  std::string dedupe_key;  ///< source \x1f id
  std::string action_id;
  bool dry_run = false;    ///< POST /api/v1/actions with "dry_run": true: checked, not appended
};

/// POST /api/v1/actions: checks the token (admin or control:<workflow>; 401/403) and the
/// JSON body (400 naming the field), finds the engine of the task in the views when the
/// body does not name it (404 when unknown), and returns the event to append, or the
/// refusal. Any thread.
std::variant<HttpReply, OperatorAction> prepare_operator_action(std::string_view body,
                                                                const std::optional<std::string>& bearer,
                                                                const ApiContext& ctx);

/// POST /api/v1/topics/{topic}/republish: the event stored at {"offset"} of {"from_topic"}
/// (default: the same topic) again, under a new id and a source naming who asked
/// (/diaspora/console/<subject>), with extension attributes republishedfrom
/// ("<topic>/<offset>"), originalid and originalsource. Checks the token (admin, or publish
/// on the topic and subscribe on from_topic; 401/403) and the body (400 naming the field;
/// 404 when nothing is stored at that offset, saying the retained range). Returned as an
/// OperatorAction (topic, payload, dedupe key; action_id is the new event's id). Any thread.
std::variant<HttpReply, OperatorAction> prepare_republish(std::string_view path, std::string_view body,
                                                          const std::optional<std::string>& bearer, const ApiContext& ctx);

/// POST /api/v1/groups/{group}/reset: an admin sets a consumer group's committed offset on a
/// topic (docs/protocol.md, "Resetting a consumer group").
struct GroupReset {
  std::string group, topic;
  std::uint64_t offset = 0;                 ///< the next offset the group reads
  std::optional<std::uint64_t> previous;    ///< its committed offset before, if any
};

/// Checks the token (admin; 401/403), the group name and the JSON body ({"topic", and one of
/// "offset" (a number, "earliest" or "latest") or "time" (RFC 3339: the first event
/// appended at or after it)}; 400 naming the field; 404 for an unknown topic; an offset
/// outside the topic's retained range is 400 saying the range), and returns what to commit.
/// Any thread.
std::variant<HttpReply, GroupReset> prepare_group_reset(std::string_view path, std::string_view body,
                                                        const std::optional<std::string>& bearer, const ApiContext& ctx);

/// The security headers every console response carries (Content-Security-Policy that
/// allows only this origin and no inline script, nosniff, no referrer, no framing).
const std::vector<std::pair<std::string, std::string>>& console_headers();

}  // namespace diaspora::relay
