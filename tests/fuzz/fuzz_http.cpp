// Fuzz target: the relay's HTTP API as a client reaches it (handle_http: the request target's
// percent-decoding and query, the bearer token, /metrics, /api/v1/topics, the views'
// queries, the console's files) and POST /api/v1/actions (prepare_operator_action), over a
// real log holding the valid events of tests/data and the views built from it. The first
// byte picks the token (none, not a bearer, admin, a workflow's own, garbage) and the
// method; then "TARGET\n--\nBODY". Invariants: nothing throws; a reply has an HTTP status;
// a JSON reply parses; a refusal of a token says so (401/403); a console path never serves a
// file outside the console's folder.
#include <boost/json.hpp>

#include <fstream>
#include <future>

#include "diaspora/event.hpp"
#include "diaspora/files.hpp"
#include "diaspora/token.hpp"
#include "fuzz_support.hpp"
#include "http_api.hpp"
#include "topic_log.hpp"

using namespace diaspora;
namespace fs = std::filesystem;

namespace {

const std::string kSecret(40, 'h');
const std::string kOutside = "a file outside the console's folder: never served\n";

struct World {
  std::unique_ptr<relay::LogStore> store;
  std::unique_ptr<relay::Views> views;
  TokenVerifier verifier{kSecret};
  relay::Metrics metrics;
  std::string admin, workflow_token;

  World() {
    const fs::path dir = fuzz::scratch_dir() / "http";
    relay::LogOptions lo;
    lo.data_dir = dir / "log";
    lo.fsync = relay::FsyncPolicy::parse("never");
    store = std::make_unique<relay::LogStore>(lo);
    std::vector<relay::AppendRecord> records;
    for (const auto& e : fs::directory_iterator(fs::path(DIASPORA_SOURCE_DIR) / "tests/data/events/valid"))
      records.push_back({"", read_file(e.path())});
    std::promise<void> done;
    store->append("wf.events", "", 0, std::move(records), [&](const relay::AppendResult&) { done.set_value(); });
    done.get_future().wait();
    views = std::make_unique<relay::Views>(*store, relay::Views::Options{.dir = dir / "views"});
    views->catch_up();
    fs::create_directories(dir / "console");
    write_file_atomic(dir / "console" / "index.html", "<!doctype html>");
    write_file_atomic(dir / "secret.txt", kOutside);
    const auto now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    TokenClaims c;
    c.issued_at = now;
    c.expires_at = now + std::chrono::hours(1);
    c.subject = "ops";
    c.scopes = {"admin"};
    admin = issue_token(kSecret, c);
    c.subject = "wf";
    c.scopes = {"subscribe:wf.*", "control:wf"};
    workflow_token = issue_token(kSecret, c);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static World w;
  fuzz::Input in(data, size);
  const std::uint8_t how = in.byte();
  const std::string_view target = in.part();
  const std::string_view body = in.rest();
  std::optional<std::string> bearer;
  switch (how % 5) {
    case 0: break;
    case 1: bearer = relay::bearer_token(std::string_view("Basic b3BzOm9wcw==")); break;
    case 2: bearer = w.admin; break;
    case 3: bearer = w.workflow_token; break;
    default: bearer = std::string(body.substr(0, 64)); break;
  }
  relay::ApiContext ctx{*w.store, w.verifier, w.metrics, (how & 8) != 0, false, w.views.get(),
                        fuzz::scratch_dir() / "http" / "console"};
  const relay::HttpReply r = relay::handle_http((how & 16) == 0, target, bearer, ctx);
  FUZZ_CHECK(r.status >= 200 && r.status < 600);
  FUZZ_CHECK(r.body != kOutside);  // (a refusal may echo the path asked, which may be the text)
  if (r.content_type.starts_with("application/json")) {
    boost::system::error_code ec;
    (void)boost::json::parse(r.body, ec);
    FUZZ_CHECK(!ec);
  }
  if (r.challenge) FUZZ_CHECK(r.status == 401);

  const auto action = relay::prepare_operator_action(body, bearer, ctx);
  if (const auto* refusal = std::get_if<relay::HttpReply>(&action)) {
    FUZZ_CHECK(refusal->status >= 400 && refusal->status < 500);
  } else {
    const auto& a = std::get<relay::OperatorAction>(action);
    FUZZ_CHECK(relay::valid_topic_name(a.topic));
    (void)decode_event(a.payload);  // the event appended is a valid CloudEvent (throws if not)
  }
  return 0;
}
