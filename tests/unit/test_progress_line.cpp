// The progress channel's lines (docs/run.md, "Commands"): what a command may write on
// DIASPORA_PROGRESS_FD and what is ignored.
#include <gtest/gtest.h>

#include "diaspora/process.hpp"

using diaspora::adapters::parse_progress_line;
using Kind = diaspora::adapters::ProgressLine::Kind;

TEST(ProgressLine, ProgressWithAndWithoutStep) {
  auto p = parse_progress_line("progress 0.25 12");
  EXPECT_EQ(p.kind, Kind::progress);
  EXPECT_DOUBLE_EQ(p.value, 0.25);
  EXPECT_EQ(p.step, 12);
  p = parse_progress_line("progress 1");
  EXPECT_EQ(p.kind, Kind::progress);
  EXPECT_EQ(p.step, -1);
  EXPECT_EQ(parse_progress_line("progress 1.5").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("progress nan").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("progress half").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("progress").kind, Kind::none);
}

TEST(ProgressLine, OneMetricOrSeveralInOneReport) {
  auto p = parse_progress_line("metric rows 5000");
  ASSERT_EQ(p.kind, Kind::metric);
  ASSERT_EQ(p.metrics.size(), 1u);
  EXPECT_EQ(p.metrics[0].first, "rows");
  EXPECT_DOUBLE_EQ(p.metrics[0].second, 5000);
  p = parse_progress_line("metric eval_after_task 2 accuracy.t0 0.91 accuracy.t1 0.875");
  ASSERT_EQ(p.kind, Kind::metric);
  ASSERT_EQ(p.metrics.size(), 3u);
  EXPECT_EQ(p.metrics[2].first, "accuracy.t1");
  const auto values = p.metric_values();
  ASSERT_EQ(values.size(), 3u);
  EXPECT_STREQ(values[1].name, "accuracy.t0");
  EXPECT_DOUBLE_EQ(values[1].value, 0.91);
}

TEST(ProgressLine, BadMetricLinesAreIgnoredWhole) {
  EXPECT_EQ(parse_progress_line("metric").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("metric rows").kind, Kind::none);             // no value
  EXPECT_EQ(parse_progress_line("metric a 1 b").kind, Kind::none);            // a pair cut short
  EXPECT_EQ(parse_progress_line("metric a 1 a 2").kind, Kind::none);          // a name twice
  EXPECT_EQ(parse_progress_line("metric a inf").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("metric " + std::string(64, 'x') + " 1").kind, Kind::none);
  std::string many = "metric";
  for (int i = 0; i < 33; ++i) many += " m" + std::to_string(i) + " 1";
  EXPECT_EQ(parse_progress_line(many).kind, Kind::none);  // more than 32 in one report
  EXPECT_EQ(parse_progress_line("heartbeat").kind, Kind::heartbeat);
  EXPECT_EQ(parse_progress_line("hello").kind, Kind::none);
}

TEST(ProgressLine, ACheckpointLineCarriesAnItemUriAndNoHook) {
  auto p = parse_progress_line("checkpoint diaspora://wf.data.learn/42");
  EXPECT_EQ(p.kind, Kind::checkpoint);
  EXPECT_EQ(p.uri, "diaspora://wf.data.learn/42");
  std::vector<diaspora_metric_value> mv;
  diaspora_task_info i{};
  EXPECT_EQ(diaspora::adapters::apply_progress_line(p, i, mv), diaspora::adapters::ProgressHook::none);
  EXPECT_EQ(parse_progress_line("checkpoint").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("checkpoint file:///tmp/ckpt").kind, Kind::none);  // only items travel this way
  EXPECT_EQ(parse_progress_line("checkpoint diaspora://wf.data.learn/x").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("checkpoint diaspora://wf.data.learn/4 5").kind, Kind::none);  // one URI
}

TEST(ProgressLine, AResultLineCarriesOneJsonObject) {
  auto p = parse_progress_line(R"(result {"steps":288,"error_matrix":[[0.01,null]]})");
  ASSERT_EQ(p.kind, Kind::result);
  EXPECT_EQ(p.result.at("steps").as_int64(), 288);
  // Numbers as written (boost's own parser reads this one a unit in the last place off).
  EXPECT_EQ(parse_progress_line("result {\"e\":0.011907458305358887}").result.at("e").as_double(), 0.011907458305358887);
  std::vector<diaspora_metric_value> mv;
  diaspora_task_info i{};
  EXPECT_EQ(diaspora::adapters::apply_progress_line(p, i, mv), diaspora::adapters::ProgressHook::none);
  EXPECT_EQ(parse_progress_line("result [1, 2]").kind, Kind::none);     // an object only
  EXPECT_EQ(parse_progress_line("result {\"a\": ").kind, Kind::none);  // cut short
  EXPECT_EQ(parse_progress_line("result").kind, Kind::none);
  EXPECT_EQ(parse_progress_line("result " + std::string(1u << 20, ' ') + "{}").kind, Kind::none);  // over 1 MiB
}

TEST(ProgressLine, EachKindIsToldWithItsHookAndFields) {
  using diaspora::adapters::apply_progress_line;
  using diaspora::adapters::ProgressHook;
  std::vector<diaspora_metric_value> mv;
  diaspora_task_info i{};
  i.step = -1;
  EXPECT_EQ(apply_progress_line(parse_progress_line("progress 0.5 12"), i, mv), ProgressHook::progress);
  EXPECT_EQ(i.progress, 0.5);
  EXPECT_EQ(i.step, 12);
  EXPECT_EQ(i.metric_count, 0u);
  diaspora_task_info m{};
  const auto metrics = parse_progress_line("metric rows 6000 mb 12.5");  // the names are views into it
  EXPECT_EQ(apply_progress_line(metrics, m, mv), ProgressHook::heartbeat);
  ASSERT_EQ(m.metric_count, 2u);
  EXPECT_STREQ(m.metrics[0].name, "rows");
  EXPECT_EQ(m.metrics[1].value, 12.5);
  diaspora_task_info h{};
  EXPECT_EQ(apply_progress_line(parse_progress_line("heartbeat"), h, mv), ProgressHook::heartbeat);
  EXPECT_EQ(h.metrics, nullptr);
  diaspora_task_info n{};
  EXPECT_EQ(apply_progress_line(parse_progress_line("progress 2"), n, mv), ProgressHook::none);
  EXPECT_EQ(n.progress, 0.0);
}
