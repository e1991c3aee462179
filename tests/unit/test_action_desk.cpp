// The plugin's action desk on its own (plugin/src/action_desk.hpp): the documented bounds
// (4,096 actions waiting to be polled, 65,536 delivered and unacknowledged; beyond them the
// oldest fail with a reason), refusals of requests the C struct cannot carry, and the
// hand-over between callback and polling, the ABI 1.0 caller's shorter struct. Outcomes are
// what the plugin publishes as org.diaspora.action.done.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "action_desk.hpp"
#include "test_helpers.hpp"

namespace dp = diaspora::plugin;

namespace {

struct Outcome {
  std::string id;
  bool ok;
  std::string message;
};

struct Desk {
  std::vector<Outcome> outcomes;
  dp::ActionDesk desk{[this](const dp::Action& a, bool ok, std::string_view m) {
    outcomes.push_back({a.id, ok, std::string(m)});
  }};
};

dp::Action restart(int i) {
  dp::Action a;
  a.id = "a-" + std::to_string(i);
  a.kind_name = "restart";
  a.kind = DIASPORA_ACTION_RESTART;
  a.task_id = "t";
  return a;
}

diaspora_action fresh() {
  diaspora_action a{};
  a.struct_size = sizeof a;
  return a;
}

}  // namespace

TEST(ActionDesk, PolledActionsBeyondTheBoundFailOldestFirst) {
  Desk d;
  const int n = static_cast<int>(dp::ActionDesk::kMaxPollQueue) + 3;
  for (int i = 0; i < n; ++i) d.desk.submit(restart(i));
  EXPECT_EQ(d.desk.received(), static_cast<std::uint64_t>(n));
  d.desk.deliver();  // no callback: to polling, the oldest three expire
  ASSERT_EQ(d.outcomes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(d.outcomes[static_cast<std::size_t>(i)].id, "a-" + std::to_string(i));
    EXPECT_FALSE(d.outcomes[static_cast<std::size_t>(i)].ok);
    EXPECT_EQ(d.outcomes[static_cast<std::size_t>(i)].message, "the engine did not poll for it (4096 actions waiting)");
  }
  diaspora_action a = fresh();
  std::string error;
  ASSERT_EQ(d.desk.poll(&a, error), DIASPORA_OK);
  EXPECT_EQ(std::string(a.id), "a-3");  // the oldest that remained
  EXPECT_EQ(d.desk.ack(a.id, true, "", error), DIASPORA_OK);
  EXPECT_EQ(d.outcomes.back().id, "a-3");
  EXPECT_TRUE(d.outcomes.back().ok);
  EXPECT_EQ(d.desk.ack(a.id, true, "", error), DIASPORA_ERR_NOT_FOUND);  // acknowledged once only
  EXPECT_NE(error.find("not waiting for an acknowledgement"), std::string::npos) << error;
}

TEST(ActionDesk, UnacknowledgedActionsBeyondTheBoundFailOldestFirst) {
  Desk d;
  int delivered = 0;
  ASSERT_EQ(d.desk.set_callback([](const diaspora_action*, void* u) { ++*static_cast<int*>(u); }, &delivered),
            DIASPORA_OK);
  const int n = static_cast<int>(dp::ActionDesk::kMaxUnacked) + 2;
  for (int i = 0; i < n; ++i) d.desk.submit(restart(i));
  d.desk.deliver();
  EXPECT_EQ(delivered, n);
  ASSERT_EQ(d.outcomes.size(), 2u);
  EXPECT_EQ(d.outcomes[0].id, "a-0");
  EXPECT_EQ(d.outcomes[1].id, "a-1");
  EXPECT_EQ(d.outcomes[0].message, "never acknowledged by the engine");
  std::string error;
  EXPECT_EQ(d.desk.ack("a-0", true, "", error), DIASPORA_ERR_NOT_FOUND);  // expired: no second outcome
  EXPECT_EQ(d.desk.ack("a-2", false, "could not", error), DIASPORA_OK);
  EXPECT_EQ(d.outcomes.back().message, "could not");
}

TEST(ActionDesk, RequestsTooLongForTheStructAreRefusedWithAnOutcome) {
  Desk d;
  diaspora::events::ActionRequested req;
  req.action_id = "r1";
  req.action = "migrate";
  req.reason = "slow";
  req.target_site = std::string(DIASPORA_MAX_ID + 1, 's');
  const std::string why = d.desk.submit_request(req, 0);
  EXPECT_NE(why.find("refused"), std::string::npos) << why;
  ASSERT_EQ(d.outcomes.size(), 1u);
  EXPECT_EQ(d.outcomes[0].id, "r1");
  EXPECT_FALSE(d.outcomes[0].ok);
  EXPECT_EQ(d.desk.received(), 0u);
  // An alert is for people: ignored, no outcome; a valid one is queued with its fields.
  req.action = "alert";
  req.target_site.reset();
  EXPECT_EQ(d.desk.submit_request(req, 0), "");
  EXPECT_EQ(d.desk.received(), 0u);
  req.action = "migrate";
  req.target_site = "b";
  req.task_id = "t9";
  EXPECT_EQ(d.desk.submit_request(req, 1'700'000'000'123'456), "");
  d.desk.deliver();
  diaspora_action a = fresh();
  std::string error;
  ASSERT_EQ(d.desk.poll(&a, error), DIASPORA_OK);
  EXPECT_EQ(a.kind, DIASPORA_ACTION_MIGRATE);
  EXPECT_EQ(std::string(a.target_site), "b");
  EXPECT_EQ(std::string(a.task_id), "t9");
  EXPECT_EQ(std::string(a.origin), "control");
  EXPECT_GT(a.issued_us, 1'700'000'000'123'456);  // received now; requested back then
  EXPECT_EQ(a.requested_us, 1'700'000'000'123'456);
}

TEST(ActionDesk, AnAbi10CallerPollsWithTheShorterStructAndNothingIsWrittenPastIt) {
  Desk d;
  diaspora::events::ActionRequested req;
  req.action_id = "r2";
  req.action = "restart";
  req.task_id = "t1";
  ASSERT_EQ(d.desk.submit_request(req, 42), "");
  ASSERT_EQ(d.desk.submit_request(req, 43), "");
  d.desk.deliver();
  // A 1.0 engine's struct ends where requested_us begins: the bytes after it are not its own.
  constexpr std::size_t v10 = offsetof(diaspora_action, requested_us);
  diaspora_action a;
  std::memset(&a, 0xAB, sizeof a);
  a.struct_size = v10;
  std::string error;
  ASSERT_EQ(d.desk.poll(&a, error), DIASPORA_OK) << error;
  EXPECT_EQ(std::string(a.id), "r2");
  EXPECT_EQ(std::string(a.task_id), "t1");
  EXPECT_GT(a.issued_us, 0);
  const auto* tail = reinterpret_cast<const unsigned char*>(&a) + v10;
  for (std::size_t i = 0; i < sizeof a - v10; ++i) EXPECT_EQ(tail[i], 0xAB) << "byte " << i << " past the 1.0 struct";
  // The whole struct gets it.
  diaspora_action b = fresh();
  ASSERT_EQ(d.desk.poll(&b, error), DIASPORA_OK) << error;
  EXPECT_EQ(b.requested_us, 43);
}

TEST(ActionDesk, ActionsWaitingForTheCallbackGoToPollingWhenItIsRemoved) {
  Desk d;
  int delivered = 0;
  ASSERT_EQ(d.desk.set_callback([](const diaspora_action*, void* u) { ++*static_cast<int*>(u); }, &delivered),
            DIASPORA_OK);
  d.desk.submit(restart(1));  // waits for the control thread's deliver()
  ASSERT_EQ(d.desk.set_callback(nullptr, nullptr), DIASPORA_OK);
  d.desk.deliver();
  EXPECT_EQ(delivered, 0);
  diaspora_action a = fresh();
  std::string error;
  ASSERT_EQ(d.desk.poll(&a, error), DIASPORA_OK);
  EXPECT_EQ(std::string(a.id), "a-1");
  EXPECT_EQ(d.desk.poll(&a, error), DIASPORA_ERR_EMPTY);
}
