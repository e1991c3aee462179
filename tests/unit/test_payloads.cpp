#include <boost/json/serialize.hpp>

#include <algorithm>

#include "diaspora/json_schema.hpp"
#include "diaspora/payloads.hpp"
#include "test_helpers.hpp"

namespace ev = diaspora::events;
using diaspora::EventErrc;
using diaspora::EventError;

namespace {

template <class P>
P round_trip(const P& p) {
  diaspora::Event e = ev::make_event("/diaspora/test", p);
  EXPECT_EQ(e.type, P::type);
  diaspora::Event back = diaspora::decode_event(diaspora::encode_event(e));
  return ev::payload_of<P>(back);
}

}  // namespace

TEST(Payloads, EveryTypeHasASchema) {
  EXPECT_EQ(ev::all_types().size(), 18u);
  for (auto t : ev::all_types())
    EXPECT_NE(diaspora::schema::builtin("events/" + std::string(t) + ".schema.json"), nullptr) << t;
  EXPECT_TRUE(ev::is_known_type("org.diaspora.task.failed"));
  EXPECT_TRUE(ev::is_known_type("org.diaspora.metric"));
  EXPECT_TRUE(ev::is_known_type("org.diaspora.plugin.warning"));
  EXPECT_TRUE(ev::is_known_type("org.diaspora.plugin.stats"));
  EXPECT_FALSE(ev::is_known_type("org.diaspora.task.bogus"));
  EXPECT_TRUE(std::is_sorted(ev::all_types().begin(), ev::all_types().end()));
}

TEST(Payloads, TaskEventsRoundTrip) {
  ev::TaskSubmitted s;
  s.task_id = "t-1";
  s.site = "edge";
  s.attempt = 0;
  s.deadline_s = 120.5;
  s.resources = ev::TaskResources{.cpus = 2, .memory_bytes = 1 << 30, .gpus = std::nullopt};
  auto s2 = round_trip(s);
  EXPECT_EQ(s2.task_id, "t-1");
  EXPECT_EQ(s2.site, "edge");
  EXPECT_EQ(s2.deadline_s, 120.5);
  ASSERT_TRUE(s2.resources);
  EXPECT_EQ(s2.resources->memory_bytes, 1 << 30);
  EXPECT_FALSE(s2.resources->gpus);
  EXPECT_FALSE(s2.workflow);

  ev::TaskProgress p;
  p.task_id = "t-1";
  p.progress = 0.25;
  p.metrics = ev::Metrics{{"step_time_s", 0.5}, {"loss", 1.25}};
  auto p2 = round_trip(p);
  EXPECT_EQ(p2.progress, 0.25);
  EXPECT_EQ(p2.metrics->at("loss"), 1.25);

  ev::TaskMigrated m;
  m.task_id = "t-2";
  m.from_site = "a";
  m.to_site = "b";
  m.reason = "site a step time 3x baseline";
  auto m2 = round_trip(m);
  EXPECT_EQ(m2.to_site, "b");
  diaspora::Event e = ev::make_event("/x", m);
  EXPECT_EQ(e.subject, "t-2");
  EXPECT_TRUE(e.time_point().has_value());
}

TEST(Payloads, OtherTypesRoundTrip) {
  ev::AnomalyPredicted a;
  a.series = "site.edge.step_time";
  a.score = 0.93;
  a.detector = "ensemble";
  a.forecast = ev::Forecast{.metric = "memory", .eta_s = 42, .threshold = 0.95};
  auto a2 = round_trip(a);
  EXPECT_EQ(a2.forecast->eta_s, 42);
  ev::ActionRequested r;
  r.action_id = "act-1";
  r.action = "migrate";
  r.reason = "slow";
  r.target_site = "cluster";
  EXPECT_EQ(round_trip(r).target_site, "cluster");
  ev::DataArrived d;
  d.stream = "frames";
  d.seq = 12;
  d.checksum = "crc32c:0a1b2c3d";
  EXPECT_EQ(round_trip(d).seq, 12);
}

TEST(Payloads, MetricSampleRoundTrip) {
  ev::MetricSample m;
  m.scope = "task";
  m.id = "recon-17";
  m.name = "gpu:0.util";
  m.value = 0.875;
  m.site = "edge";
  diaspora::Event e = ev::make_event("/diaspora/test", m);
  EXPECT_EQ(e.subject, "recon-17");
  EXPECT_FALSE(e.data->as_object().contains("count"));  // absent = 1 sample
  auto m2 = round_trip(m);
  EXPECT_EQ(m2.scope, "task");
  EXPECT_EQ(m2.id, "recon-17");
  EXPECT_EQ(m2.name, "gpu:0.util");
  EXPECT_EQ(m2.value, 0.875);
  EXPECT_EQ(m2.site, "edge");
  EXPECT_FALSE(m2.count);

  m.scope = "site";
  m.id = "cluster-a";
  m.site.reset();
  m.count = 17;
  auto m3 = round_trip(m);
  EXPECT_EQ(m3.scope, "site");
  EXPECT_EQ(m3.count, 17);
  EXPECT_FALSE(m3.site);

  m.count = 0;  // a coalesced sample stands for at least one
  EXPECT_THROW(diaspora::encode_event(ev::make_event("/x", m)), EventError);
  m.count.reset();
  m.scope = "worker";
  EXPECT_THROW(diaspora::encode_event(ev::make_event("/x", m)), EventError);
  m.scope = "task";
  m.name = "step time";
  EXPECT_THROW(diaspora::encode_event(ev::make_event("/x", m)), EventError);
}

TEST(Payloads, PluginWarningRoundTrip) {
  ev::PluginWarning w;
  w.code = "invalid_transition";
  w.message = "task_completed for 't-3' before task_started";
  w.task_id = "t-3";
  w.count = 2;
  w.engine = "parsl";
  diaspora::Event e = ev::make_event("/diaspora/test", w);
  EXPECT_EQ(e.subject, "t-3");
  auto w2 = round_trip(w);
  EXPECT_EQ(w2.code, "invalid_transition");
  EXPECT_EQ(w2.message, w.message);
  EXPECT_EQ(w2.task_id, "t-3");
  EXPECT_EQ(w2.count, 2);
  EXPECT_EQ(w2.engine, "parsl");

  ev::PluginWarning bare;
  bare.code = "spool_over_limit";
  bare.message = "spool holds 1.2 GiB";
  EXPECT_FALSE(ev::make_event("/x", bare).subject);  // no task, no subject
  auto b2 = round_trip(bare);
  EXPECT_EQ(b2.code, "spool_over_limit");
  EXPECT_FALSE(b2.task_id);
  EXPECT_FALSE(b2.count);
  EXPECT_FALSE(b2.engine);

  bare.code = "disk_full";
  try {
    diaspora::encode_event(ev::make_event("/x", bare));
    FAIL() << "unknown warning code accepted";
  } catch (const EventError& err) {
    EXPECT_EQ(err.code(), EventErrc::invalid_data);
    EXPECT_NE(std::string(err.what()).find("data.code"), std::string::npos) << err.what();
  }
  bare.code = "events_lost";
  bare.message = "";
  EXPECT_THROW(diaspora::encode_event(ev::make_event("/x", bare)), EventError);
}

TEST(Payloads, PluginStatsRoundTrip) {
  ev::PluginStats s;
  s.engine = "dask";
  s.events_accepted = 12873;
  s.events_acked = 12850;
  s.events_spilled = 311;
  s.metrics_coalesced = 1204;
  s.events_lost = 0;
  s.spool_records = 23;
  s.spool_bytes = std::int64_t{5} << 32;  // beyond 32 bits
  s.reconnects = 2;
  s.invalid_transitions = 1;
  s.actions_received = 4;
  s.connected = true;
  diaspora::Event e = ev::make_event("/diaspora/test", s);
  EXPECT_FALSE(e.subject);
  auto s2 = round_trip(s);
  EXPECT_EQ(s2.engine, "dask");
  EXPECT_EQ(s2.events_accepted, 12873);
  EXPECT_EQ(s2.events_acked, 12850);
  EXPECT_EQ(s2.events_spilled, 311);
  EXPECT_EQ(s2.metrics_coalesced, 1204);
  EXPECT_EQ(s2.events_lost, 0);
  EXPECT_EQ(s2.spool_records, 23);
  EXPECT_EQ(s2.spool_bytes, std::int64_t{5} << 32);
  EXPECT_EQ(s2.reconnects, 2);
  EXPECT_EQ(s2.invalid_transitions, 1);
  EXPECT_EQ(s2.actions_received, 4);
  EXPECT_TRUE(s2.connected);

  // Every counter and `connected` are required: all are written even when zero / false.
  ev::PluginStats zero;
  zero.engine = "parsl";
  auto j = ev::to_json(zero);
  EXPECT_EQ(j.as_object().size(), 12u);
  EXPECT_FALSE(round_trip(zero).connected);
  auto without = j;
  without.as_object().erase("connected");
  EXPECT_THROW(ev::from_json<ev::PluginStats>(without), EventError);

  s.events_lost = -1;
  try {
    diaspora::encode_event(ev::make_event("/x", s));
    FAIL() << "negative counter accepted";
  } catch (const EventError& err) {
    EXPECT_NE(std::string(err.what()).find("data.events_lost"), std::string::npos) << err.what();
  }
}

TEST(Payloads, InvalidPayloadsAreRefusedWithThePath) {
  ev::ActionRequested r;
  r.action_id = "act-1";
  r.action = "migrate";  // needs target_site
  r.reason = "slow";
  diaspora::Event e = ev::make_event("/x", r);
  try {
    diaspora::encode_event(e);
    FAIL() << "migrate without target_site accepted";
  } catch (const EventError& err) {
    EXPECT_EQ(err.code(), EventErrc::invalid_data);
    EXPECT_NE(std::string(err.what()).find("missing required key 'target_site'"), std::string::npos) << err.what();
  }
  ev::AnomalyPredicted a;
  a.series = "s";
  a.score = 1.5;
  a.detector = "d";
  try {
    diaspora::encode_event(ev::make_event("/x", a));
    FAIL();
  } catch (const EventError& err) {
    EXPECT_NE(std::string(err.what()).find("data.score: must be <= 1"), std::string::npos) << err.what();
  }
  diaspora::Event wrong = ev::make_event("/x", a);
  EXPECT_THROW(ev::payload_of<ev::TaskFailed>(wrong), EventError);
}
