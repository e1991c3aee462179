// The JetStream store's names (relay/src/jetstream_store.hpp); the store itself runs
// against real nats-server processes in tests/python/test_relay_jetstream.py.
#include "jetstream_store.hpp"

#include <gtest/gtest.h>

using diaspora::relay::jetstream_name;
using diaspora::relay::jetstream_unname;

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
  for (const char* bad : {"a_", "a_2", "a_ZZ", "a_2e"}) EXPECT_FALSE(jetstream_unname(bad)) << bad;
}
