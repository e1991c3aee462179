// The JetStream store's names and what it reads back from the cluster
// (relay/src/jetstream_store.hpp); the store itself runs against real nats-server processes
// in tests/python/test_relay_jetstream.py and test_relay_federation.py.
#include "diaspora/event.hpp"
#include "jetstream_store.hpp"

#include <gtest/gtest.h>

using diaspora::relay::jetstream_name;
using diaspora::relay::jetstream_unname;
using diaspora::relay::parse_group_key;
using diaspora::relay::parse_message_get;
using diaspora::relay::parse_stored_number;
using diaspora::relay::topic_of_stream_name;
using diaspora::relay::invalid_source;
using diaspora::relay::JetStreamOptions;
using diaspora::relay::JetStreamSource;
using diaspora::relay::stored_event_text;

TEST(JetStreamNames, EveryTopicCharacterOutsideTheSafeOnesIsEscapedAndComesBack) {
  EXPECT_EQ(jetstream_name("beam.events"), "beam_2Eevents");
  EXPECT_EQ(jetstream_name("a_b-C9"), "a_5Fb-C9");
  // Distinct topics get distinct names ('_' is escaped too, so "a_2E" is not "a.").
  EXPECT_NE(jetstream_name("a_2E"), jetstream_name("a."));
  for (const std::string t : {"beam.events", "x", "a_b.c-d", "_._", "A.b.C.0.9"}) {
    const std::string n = jetstream_name(t);
    EXPECT_EQ(n.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"), std::string::npos) << n;
    EXPECT_EQ(n.find('.'), std::string::npos) << n;  // one NATS subject token
    EXPECT_EQ(jetstream_unname(n), t);
  }
  // Not names this store made: refused, not guessed.
  // "_2D" and "_61" decode to characters jetstream_name keeps ('-', 'a'); '.' and ' ' are
  // never in one of its names: two streams must not read back as one topic.
  for (const char* bad : {"a_", "a_2", "a_ZZ", "a_2e", "a_2D", "_61", "a.b", "a b"})
    EXPECT_FALSE(jetstream_unname(bad)) << bad;
}

TEST(JetStreamNames, WhatTheClusterHoldsIsReadBackOnlyWhenTheRelayCouldHaveWrittenIt) {
  EXPECT_EQ(topic_of_stream_name("DIASPORA-beam_2Eevents", "DIASPORA"), "beam.events");
  EXPECT_FALSE(topic_of_stream_name("DIASPORAX-beam", "DIASPORA"));  // another prefix
  EXPECT_FALSE(topic_of_stream_name("DIASPORA-", "DIASPORA"));       // no topic
  EXPECT_FALSE(topic_of_stream_name("DIASPORA-_2Ebeam", "DIASPORA"));  // ".beam": not a valid topic
  const auto gt = parse_group_key("ops-group.beam_2Eevents");
  ASSERT_TRUE(gt);
  EXPECT_EQ(gt->first, "ops-group");
  EXPECT_EQ(gt->second, "beam.events");
  EXPECT_FALSE(parse_group_key("ops_2Dgroup.beam_2Eevents"));  // '-' is kept: "_2D" is no name of it
  EXPECT_FALSE(parse_group_key("ops-group"));                  // no topic
  EXPECT_EQ(parse_stored_number("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "18446744073709551616", "0x10"})
    EXPECT_FALSE(parse_stored_number(bad)) << bad;
}

TEST(JetStreamNames, OnlyAJsonObjectReadBackIsAnEventTheRelayStored) {
  EXPECT_TRUE(stored_event_text(R"({"id":"1","source":"/s"})"));
  for (const char* bad : {"", "junk", "[1,2]", "\"text\"", "1", "{\"id\": \"x\"", "{} {}", "null"})
    EXPECT_FALSE(stored_event_text(bad)) << bad;
}

TEST(JetStreamSources, ASourceIsRefusedWithTheReasonWhenItCannotBeUsed) {
  JetStreamOptions own;  // prefix DIASPORA, subject_root diaspora
  EXPECT_EQ(invalid_source(JetStreamSource{"siteA", "siteA", "siteA", {"*"}}, own), std::nullopt);
  const std::pair<JetStreamSource, const char*> bad[] = {
      {{"", "siteA", "siteA", {"*"}}, "domain ''"},
      {{"site.A", "siteA", "siteA", {"*"}}, "domain 'site.A'"},
      {{"siteA", "site_A", "siteA", {"*"}}, "prefix 'site_A'"},
      {{"siteA", "siteA", "site.A", {"*"}}, "subject_root 'site.A'"},
      {{"siteA", "siteA", "diaspora", {"*"}}, "this relay's own subject_root"},
      {{"siteA", "siteA", "siteA", {}}, "lists no topics"},
      {{"siteA", "siteA", "siteA", {"a b"}}, "topic pattern 'a b'"},
  };
  for (const auto& [src, said] : bad) {
    const auto why = invalid_source(src, own);
    ASSERT_TRUE(why) << said;
    EXPECT_NE(why->find(said), std::string::npos) << *why;
  }
}

// The stream leader's answer to a message get, read strictly: the message at the asked
// sequence with its bytes and store time; JetStream's 404 as removed; anything else refused.
TEST(JetStreamNames, ALeadersMessageGetAnswerIsReadOnlyForTheAskedSequence) {
  const std::string ok = R"({"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":"d.t.x","seq":42,)"
                         R"("hdrs":"TkFUUy8xLjANCg0K","data":"eyJhIjoxfQ==","time":"2026-12-07T08:00:00.123456789Z"}})";
  const auto got = parse_message_get(ok, 42);
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->removed);
  EXPECT_EQ(got->data, R"({"a":1})");
  EXPECT_EQ(got->time_us, *diaspora::parse_rfc3339_us("2026-12-07T08:00:00.123456Z"));
  EXPECT_FALSE(parse_message_get(ok, 43)) << "another sequence's message";
  const auto gone = parse_message_get(R"({"type":"x","error":{"code":404,"err_code":10037,"description":"no message found"}})", 42);
  ASSERT_TRUE(gone);
  EXPECT_TRUE(gone->removed);
  EXPECT_FALSE(parse_message_get(R"({"error":{"code":503,"description":"leader gone"}})", 42));
  EXPECT_FALSE(parse_message_get(R"({"message":{"seq":42,"data":"!!","time":"2026-12-07T08:00:00Z"}})", 42)) << "bad base64";
  EXPECT_FALSE(parse_message_get(R"({"message":{"seq":42,"data":"eyJhIjoxfQ==","time":"yesterday"}})", 42)) << "bad time";
  EXPECT_FALSE(parse_message_get("not json", 42));
  const auto empty = parse_message_get(R"({"message":{"seq":1,"time":"2026-12-07T08:00:00Z"}})", 1);
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->data.empty());
}
