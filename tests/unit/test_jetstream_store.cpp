// The JetStream store's names and what it reads back from the cluster
// (relay/src/jetstream_store.hpp); the store itself runs against real nats-server processes
// in tests/python/test_relay_jetstream.py and test_relay_federation.py.
#include "diaspora/event.hpp"
#include "jetstream_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

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
using diaspora::relay::ReadMailbox;

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

namespace {

// An answer of the test's: counts the answers alive, so that one the mailbox loses shows.
struct Answer {
  static inline std::atomic<int> alive{0};
  std::uint64_t seq;
  explicit Answer(std::uint64_t s) : seq(s) { ++alive; }
  ~Answer() { --alive; }
};
void free_answer(Answer* a) { delete a; }

}  // namespace

TEST(JetStreamReads, AMailboxHandsOnEachAnswerOnceAndFreesWhatItWasNotAskedFor) {
  Answer::alive = 0;
  {
    ReadMailbox<Answer> box(&free_answer);
    EXPECT_TRUE(box.file(2, new Answer(2)));
    EXPECT_TRUE(box.file(1, new Answer(1)));
    EXPECT_FALSE(box.file(2, new Answer(2))) << "a second answer for one sequence is freed";
    EXPECT_TRUE(box.file(3, new Answer(3)));
    EXPECT_EQ(Answer::alive, 3);
    for (std::uint64_t seq : {1, 2}) {  // in offset order, whatever order they came in
      Answer* a = box.take(seq, std::chrono::milliseconds(0));
      ASSERT_NE(a, nullptr) << seq;
      EXPECT_EQ(a->seq, seq);
      delete a;
    }
    EXPECT_EQ(box.take(2, std::chrono::milliseconds(0)), nullptr) << "taken once";
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(box.take(4, std::chrono::milliseconds(50)), nullptr);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50)) << "it waited";
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      box.file(4, new Answer(4));
    });
    Answer* a = box.take(4, std::chrono::seconds(10));  // woken by the answer, not the time
    late.join();
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->seq, 4u);
    delete a;
    EXPECT_EQ(Answer::alive, 1);  // 3, not asked for
  }
  EXPECT_EQ(Answer::alive, 0) << "the answer not taken is freed with the mailbox";
}

// The leak CI's LeakSanitizer found: the reader thread found a read's mailbox just before the
// read ended, and filed its answer after the read had freed the answers it did not take.
TEST(JetStreamReads, AnAnswerFiledAfterTheReadEndedIsFreedNotLost) {
  Answer::alive = 0;
  auto box = std::make_shared<ReadMailbox<Answer>>(&free_answer);
  EXPECT_TRUE(box->file(7, new Answer(7)));
  auto found_by_the_reader = box;  // the reader holds it, about to file
  box->close();                    // the read ends: the answer it did not take is freed
  EXPECT_EQ(Answer::alive, 0);
  EXPECT_FALSE(found_by_the_reader->file(8, new Answer(8)));
  EXPECT_EQ(Answer::alive, 0) << "filed after the end, freed at once";
  EXPECT_EQ(box->take(8, std::chrono::milliseconds(0)), nullptr);
  box->close();  // again: nothing to do
  box.reset();
  found_by_the_reader.reset();
  EXPECT_EQ(Answer::alive, 0);

  // The same with the two threads racing: whatever the order, every answer is taken or freed.
  for (int round = 0; round < 200; ++round) {
    auto m = std::make_shared<ReadMailbox<Answer>>(&free_answer);
    std::atomic<int> taken{0};
    std::thread reader([m] {
      for (std::uint64_t seq = 1; seq <= 20; ++seq) m->file(seq, new Answer(seq));
    });
    for (std::uint64_t seq = 1; seq <= static_cast<std::uint64_t>(round % 20); ++seq)
      if (Answer* a = m->take(seq, std::chrono::milliseconds(0))) {
        ++taken;
        delete a;
      }
    m->close();
    reader.join();
    m.reset();
    ASSERT_EQ(Answer::alive, 0) << "round " << round << ", " << taken << " taken";
  }
}
