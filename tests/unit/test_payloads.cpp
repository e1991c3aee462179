#include <boost/json/serialize.hpp>

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
  EXPECT_EQ(ev::all_types().size(), 14u);
  for (auto t : ev::all_types())
    EXPECT_NE(diaspora::schema::builtin("events/" + std::string(t) + ".schema.json"), nullptr) << t;
  EXPECT_TRUE(ev::is_known_type("org.diaspora.task.failed"));
  EXPECT_FALSE(ev::is_known_type("org.diaspora.task.bogus"));
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
