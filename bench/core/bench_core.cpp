// Costs of the core operations every event and every connection pays: decoding and
// encoding CloudEvents (with and without typed-payload validation), verifying a token,
// loading a workflow spec. Run: build/bin/bench_core (or `make bench`).
#include <benchmark/benchmark.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>

#include <fstream>
#include <sstream>

#include "diaspora/core.hpp"
#include "event_text.hpp"

namespace {

std::string heartbeat_text() {
  diaspora::events::TaskHeartbeat hb;
  hb.task_id = "frames-000123";
  hb.site = "edge";
  hb.worker = "edge-w3";
  hb.seq = 42;
  hb.metrics = diaspora::events::Metrics{{"step_time_s", 0.125}, {"cpu", 0.83}, {"memory_bytes", 2.1e9}};
  return diaspora::encode_event(diaspora::events::make_event("/diaspora/ptycho/edge", hb));
}

void BM_DecodeHeartbeat(benchmark::State& state) {
  std::string text = heartbeat_text();
  diaspora::CodecOptions o;
  o.validate_payloads = state.range(0) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(diaspora::decode_event(text, o));
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
}
BENCHMARK(BM_DecodeHeartbeat)->Arg(0)->Arg(1)->ArgName("validate_payload");

// What the relay pays per event of a publish frame of 1,000 heartbeats: the frame parsed
// into an arena, every event checked (payload schemas on or off). Skipping the parser's
// UTF-8 check (Beast has done it) was measured at 1.5 %, not worth an option.
void BM_PublishFrame(benchmark::State& state) {
  const std::string hb = heartbeat_text();
  std::string frame = R"({"op":"publish","topic":"bench","seq":1,"events":[)";
  for (int i = 0; i < 1000; ++i) frame += (i ? "," : "") + hb;
  frame += "]}";
  diaspora::CodecOptions o;
  o.validate_payloads = state.range(0) != 0;
  for (auto _ : state) {
    boost::json::monotonic_resource arena(frame.size() * 2 + 1024);
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(frame, ec, &arena);
    for (const auto& e : v.at("events").as_array()) benchmark::DoNotOptimize(diaspora::check_event_json(e, o));
  }
  state.SetItemsProcessed(state.iterations() * 1000);
}
BENCHMARK(BM_PublishFrame)->Arg(0)->Arg(1)->ArgName("validate_payload");

// The relay's second pass over the same frame: where each event's text lies (it stores
// the text as written). Arg: bytes of padding string in each event's data (0: heartbeats
// as the plugin sends them; 1,500: a 2 KiB event of the relay benchmark's kind).
void BM_EventTexts(benchmark::State& state) {
  std::string hb = heartbeat_text();
  if (state.range(0) > 0) hb.insert(hb.rfind('}'), ",\"pad\":\"" + std::string(static_cast<std::size_t>(state.range(0)), 'p') + "\"");
  std::string frame = R"({"op":"publish","topic":"bench","seq":1,"events":[)";
  for (int i = 0; i < 1000; ++i) frame += (i ? "," : "") + hb;
  frame += "]}";
  if (diaspora::relay::event_texts(frame)->size() != 1000) state.SkipWithError("the scan did not find 1,000 events");
  for (auto _ : state) benchmark::DoNotOptimize(diaspora::relay::event_texts(frame));
  state.SetItemsProcessed(state.iterations() * 1000);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(frame.size()));
}
BENCHMARK(BM_EventTexts)->Arg(0)->Arg(1500)->ArgName("pad_bytes");

void BM_EncodeHeartbeat(benchmark::State& state) {
  diaspora::Event e = diaspora::decode_event(heartbeat_text());
  diaspora::CodecOptions o;
  o.validate_payloads = state.range(0) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(diaspora::encode_event(e, o));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EncodeHeartbeat)->Arg(0)->Arg(1)->ArgName("validate_payload");

void BM_VerifyToken(benchmark::State& state) {
  const std::string secret(48, 's');
  diaspora::TokenClaims c;
  c.subject = "bench";
  c.scopes = {"publish:task.*"};
  c.issued_at = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  c.expires_at = c.issued_at + std::chrono::hours(1);
  std::string tok = diaspora::issue_token(secret, c);
  diaspora::TokenVerifier v(secret);
  for (auto _ : state) benchmark::DoNotOptimize(v.authorize(tok, "publish", "task.started"));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_VerifyToken);

void BM_LoadSpec(benchmark::State& state) {
  std::ifstream in(std::string(DIASPORA_SOURCE_DIR) + "/examples/workflows/ptycho-stream.yaml");
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  for (auto _ : state) benchmark::DoNotOptimize(diaspora::load_spec_string(text, "ptycho-stream.yaml"));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LoadSpec);

}  // namespace

BENCHMARK_MAIN();
