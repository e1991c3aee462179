// Site health (resilience/include/diaspora/site_health.hpp): the one definition the
// policies, the relay's views and the runner's terminal view share.
#include <gtest/gtest.h>

#include "diaspora/site_health.hpp"
#include "runner_rig.hpp"

namespace {

using diaspora::SiteHealthInputs;

TEST(SiteHealth, IsTheProductOfItsPartsClampedToTheUnitRange) {
  EXPECT_DOUBLE_EQ(diaspora::site_health({}), 1.0);
  SiteHealthInputs in;
  in.speed = 0.5;
  in.failures = 1;
  in.failure_rate = 0.2;
  in.anomaly = 0.5;
  in.queue = 4;
  in.workers = 2;
  in.state = 0.5;
  EXPECT_DOUBLE_EQ(diaspora::site_health(in), 0.5 * 0.5 * 0.5 * 0.8 / 2 / 3);
  in = {};
  in.speed = 7;
  in.anomaly = -3;
  in.failures = -1;
  in.workers = 0;
  in.queue = -5;
  EXPECT_DOUBLE_EQ(diaspora::site_health(in), 1.0);  // out-of-range inputs clamped
  in = {};
  in.state = diaspora::site_state_factor("down");
  EXPECT_DOUBLE_EQ(diaspora::site_health(in), 0.0);
  EXPECT_DOUBLE_EQ(diaspora::site_state_factor("degraded"), 0.5);
  EXPECT_DOUBLE_EQ(diaspora::site_state_factor("up"), 1.0);
}

TEST(SiteHealth, AFailureCountHalvesEveryHalfLife) {
  EXPECT_DOUBLE_EQ(diaspora::decay_failures(4, 0), 4);
  EXPECT_DOUBLE_EQ(diaspora::decay_failures(4, diaspora::kSiteFailureHalfLifeS), 2);
  EXPECT_DOUBLE_EQ(diaspora::decay_failures(4, 2 * diaspora::kSiteFailureHalfLifeS), 1);
  EXPECT_DOUBLE_EQ(diaspora::decay_failures(4, 10, 10), 2);
  EXPECT_DOUBLE_EQ(diaspora::decay_failures(0, 5), 0);
  EXPECT_DOUBLE_EQ(diaspora::decay_failures(3, -5), 3);  // a clock step back does not grow it
}

TEST(SiteHealth, TheRunnersTerminalShowsTheSameDefinition) {
  using namespace diaspora::runner::testing;
  Rig r(two_sites(1));
  diaspora::runner::Site& fast = *r.sites.find("fast");
  diaspora::runner::Site& slow = *r.sites.find("slow");
  EXPECT_DOUBLE_EQ(r.sites.health(fast, 0), 1.0);
  diaspora::runner::Sites::add_penalty(fast, 1, 0);  // a failure at t = 0
  for (int k = 0; k < 5; ++k) {
    diaspora::runner::Sites::observe_step_time(fast, "burn", 0.4, 0);
    diaspora::runner::Sites::observe_step_time(slow, "burn", 0.1, 0);
  }
  SiteHealthInputs in;
  in.speed = 0.25;                                      // 4x the fastest site's step time
  in.failures = diaspora::decay_failures(1, 20);        // 20 s later
  EXPECT_DOUBLE_EQ(r.sites.health(fast, 20), diaspora::site_health(in));
  EXPECT_DOUBLE_EQ(r.sites.health(slow, 20), 1.0);
}

}  // namespace
