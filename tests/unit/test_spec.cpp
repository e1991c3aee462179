#include <cmath>

#include "diaspora/policy.hpp"
#include "diaspora/spec.hpp"
#include "test_helpers.hpp"

using diaspora::load_spec_file;
using diaspora::load_spec_string;

namespace {

std::string all_errors(const diaspora::SpecLoadResult& r) {
  std::string out;
  for (const auto& d : r.diagnostics) out += d.str() + "\n";
  return out;
}

}  // namespace

TEST(Spec, GoodCorpusAndExamplesLoad) {
  std::vector<std::filesystem::path> files =
      diaspora::test::files_in(diaspora::test::source_dir() / "tests/data/specs/good", ".yaml");
  auto examples = diaspora::test::files_in(diaspora::test::source_dir() / "examples/workflows", ".yaml");
  ASSERT_GE(examples.size(), 3u);
  files.insert(files.end(), examples.begin(), examples.end());
  for (const auto& f : files) {
    auto r = load_spec_file(f);
    EXPECT_TRUE(r.ok()) << all_errors(r);
  }
}

// Every bad file carries "# expect: <substring>" lines the loader's output must contain
// (the same lines are checked against the Python reference checker).
TEST(Spec, BadCorpusReportsTheExpectedErrors) {
  auto files = diaspora::test::files_in(diaspora::test::source_dir() / "tests/data/specs/bad", ".yaml");
  ASSERT_GE(files.size(), 25u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    auto r = load_spec_file(f);
    EXPECT_FALSE(r.ok());
    std::string out = all_errors(r);
    std::istringstream in(diaspora::test::read_file(f));
    std::string line;
    int expectations = 0;
    while (std::getline(in, line)) {
      if (!line.starts_with("# expect: ")) continue;
      ++expectations;
      EXPECT_NE(out.find(line.substr(10)), std::string::npos) << "missing '" << line.substr(10) << "' in:\n" << out;
    }
    EXPECT_GT(expectations, 0) << "bad corpus file without '# expect:' lines";
    for (const auto& d : r.diagnostics) EXPECT_EQ(d.str().rfind(f.string() + ":", 0), 0u) << d.str();
  }
}

TEST(Spec, ReportsAllErrorsInFileOrderWithPositions) {
  auto r = load_spec_string(R"(version: 1
name: demo
sites:
  - name: a
    engine: lokal
    wrokers: 2
  - name: a
    engine: local
tasks:
  - name: t
    command: run.sh
    preferred_sites: [a, b]
    deadline: 10 minutes
)", "demo.yaml");
  ASSERT_FALSE(r.ok());
  std::vector<std::string> got;
  for (const auto& d : r.diagnostics) got.push_back(d.str());
  std::vector<std::string> want = {
      "demo.yaml:5:13: error: sites[0].engine: must be one of: \"local\", \"dask\", \"parsl\", \"globus-compute\", "
      "\"slurm\"; did you mean 'local'?",
      "demo.yaml:6:5: error: sites[0].wrokers: unknown key 'wrokers'; did you mean 'workers'?",
      "demo.yaml:7:11: error: sites[1].name: duplicate name 'a' (first defined at 4:11)",
      "demo.yaml:12:26: error: tasks[0].preferred_sites[1]: unknown site 'b'; did you mean 'a'?",
      "demo.yaml:13:15: error: tasks[0].deadline: must be a duration such as 250ms, 30s, 1.5m or 2h",
  };
  EXPECT_EQ(got, want);
}

TEST(Spec, ModelCarriesTypedValuesAndDefaults) {
  auto spec = diaspora::parse_spec_string(R"(version: 1
name: typed
relay: {url: "wss://relay.example.org:7443/fabric", ca_file: ca.pem}
plugin: {spool_limit: 64MiB, queue_size: 1024, batch: {max_events: 100, max_delay: 5ms}}
sites:
  - {name: edge, engine: local, workers: 2, speed: 0.5}
  - {name: hpc, engine: slurm, workers: 64, attributes: {partition: gpu, nodes: 4}}
tasks:
  - {name: frames, kind: ptycho-reconstruct, rate: 20, duration: 1.5m, deadline: 250ms,
     resources: {cpus: 0.5, memory: 2GiB}, allowed_sites: [edge, hpc], preferred_sites: [edge]}
policies:
  - {name: slow, signal: task.step_time, action: migrate, for: 3, cooldown: 2m, to_sites: [hpc]}
faults:
  - {at: 20s, kind: slow-site, site: edge, factor: 3, for: 1h}
)");
  EXPECT_FALSE(spec.relay.embedded());
  EXPECT_EQ(spec.relay.ca_file, std::filesystem::path("ca.pem"));
  EXPECT_EQ(spec.plugin.spool_limit, 64ull << 20);
  EXPECT_EQ(spec.plugin.batch.max_delay.count(), 0.005);
  EXPECT_EQ(spec.plugin.batch.max_bytes, 1u << 20);  // default
  ASSERT_EQ(spec.sites.size(), 2u);
  EXPECT_EQ(spec.sites[1].engine, diaspora::Engine::slurm);
  EXPECT_EQ(spec.sites[1].attributes.at("nodes"), boost::json::value(4));
  EXPECT_EQ(spec.sites[0].location.line, 6);
  const auto& t = spec.tasks.at(0);
  EXPECT_EQ(t.kind, "ptycho-reconstruct");
  EXPECT_EQ(t.rate, 20.0);
  EXPECT_EQ(t.duration->count(), 90.0);
  EXPECT_EQ(t.deadline->count(), 0.25);
  EXPECT_EQ(t.resources.memory, 2ull << 30);
  EXPECT_EQ(spec.policies[0].action, diaspora::ActionKind::migrate);
  EXPECT_EQ(spec.policies[0].for_count, 3);
  EXPECT_EQ(spec.policies[0].cooldown.count(), 120.0);
  EXPECT_EQ(spec.policies[0].max_attempts, 3);  // default
  EXPECT_EQ(spec.faults[0].kind, diaspora::FaultKind::slow_site);
  EXPECT_EQ(spec.faults[0].lasts->count(), 3600.0);
  EXPECT_EQ(spec.find_site("hpc")->workers, 64);
  EXPECT_EQ(spec.find_site("nope"), nullptr);
}

TEST(Spec, YamlScalarsFollowTheCoreSchema) {
  // Quoted numbers stay strings; plain ones are numbers.
  auto r = load_spec_string("version: \"1\"\nname: q\nsites: [{name: a, engine: local, workers: '2'}]\n", "q.yaml");
  std::string out = all_errors(r);
  EXPECT_NE(out.find("q.yaml:1:10: error: version: must be 1"), std::string::npos) << out;
  EXPECT_NE(out.find("sites[0].workers: expected integer, got string"), std::string::npos) << out;
}

TEST(Spec, PlainScalarsResolveToTheCoreSchemasTypes) {
  // Every number form of the YAML 1.2 core schema, and the near misses that stay strings.
  const auto doc = diaspora::parse_yaml(
      "[12, -7, +3, 0o17, 0x1F, 1.5, -.5, 1., 2e3, 1.5E-2, +.25e+1, .inf, -.Inf, .nan, null, ~, true, False,"
      " 1.2.3, 0o18, 0xG, 1e, e5, ., +, -, 12a, '12', 99999999999999999999]",
      "s.yaml");
  ASSERT_TRUE(doc.errors.empty());
  const auto& a = doc.root.as_array();
  ASSERT_EQ(a.size(), 29u);
  const std::vector<std::int64_t> ints{12, -7, 3, 15, 31};
  for (std::size_t i = 0; i < ints.size(); ++i) EXPECT_EQ(a[i].as_int64(), ints[i]) << i;
  const std::vector<double> reals{1.5, -0.5, 1.0, 2000.0, 0.015, 2.5};
  for (std::size_t i = 0; i < reals.size(); ++i) EXPECT_DOUBLE_EQ(a[5 + i].as_double(), reals[i]) << i;
  EXPECT_EQ(a[11].as_double(), HUGE_VAL);
  EXPECT_EQ(a[12].as_double(), -HUGE_VAL);
  EXPECT_TRUE(std::isnan(a[13].as_double()));
  EXPECT_TRUE(a[14].is_null() && a[15].is_null());
  EXPECT_TRUE(a[16].as_bool() && !a[17].as_bool());
  for (std::size_t i = 18; i < 28; ++i) EXPECT_TRUE(a[i].is_string()) << i << ": " << boost::json::serialize(a[i]);
  EXPECT_DOUBLE_EQ(a[28].as_double(), 1e20);  // too large for 64 bits: still a number
}

TEST(Spec, FileProblemsAreDiagnosticsNotExceptions) {
  auto r = load_spec_file("/nonexistent/spec.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].str(), "/nonexistent/spec.yaml: error: no such file");
  diaspora::test::TempDir dir;
  EXPECT_NE(all_errors(load_spec_file(dir.path())).find("is a directory"), std::string::npos);
  auto dup = load_spec_string("version: 1\nname: a\nname: b\nsites: [{name: s, engine: local}]\n", "d.yaml");
  EXPECT_NE(all_errors(dup).find("d.yaml:3:1: error: name: duplicate key 'name' (first defined at 2:1)"),
            std::string::npos)
      << all_errors(dup);
  EXPECT_THROW(diaspora::parse_spec_string("[1, 2]"), diaspora::SpecError);
}

TEST(Spec, DurationsAndSizes) {
  EXPECT_EQ(diaspora::parse_duration("250ms")->count(), 0.25);
  EXPECT_EQ(diaspora::parse_duration("2h")->count(), 7200.0);
  EXPECT_FALSE(diaspora::parse_duration("10"));
  EXPECT_FALSE(diaspora::parse_duration("s"));
  EXPECT_FALSE(diaspora::parse_duration("5 m"));
  EXPECT_EQ(diaspora::parse_size(boost::json::value("512KiB")), 512u * 1024);
  EXPECT_EQ(diaspora::parse_size(boost::json::value(4096)), 4096u);
  EXPECT_FALSE(diaspora::parse_size(boost::json::value("5TB")));
  EXPECT_FALSE(diaspora::parse_size(boost::json::value("99999999999999999999GiB")));
}

// Syntax errors yaml-cpp reports late are placed where the construct at fault starts (the
// Python reference checker's PyYAML places them where it gave up, so these live here rather
// than in the shared bad corpus).
TEST(Spec, SyntaxErrorsPointAtTheConstructAtFault) {
  auto first = [](const std::string& text) {
    auto r = load_spec_string(text, "s.yaml");
    EXPECT_FALSE(r.ok());
    return r.diagnostics.empty() ? std::string() : r.diagnostics.front().str();
  };
  const std::string head = "version: 1\nname: x\nsites:\n  - name: edge\n    engine: local\n";
  // An unclosed flow sequence: at its '[' (line 8), saying where the parser gave up.
  EXPECT_EQ(first(head + "tasks:\n  - name: t\n    allowed_sites: [edge, hpc\n    kind: sleep\n"),
            "s.yaml:8:20: error: YAML syntax: end of sequence flow not found (the '[' here is never closed; the "
            "parser gave up at 9:9)");
  // ... or mapping, with brackets inside quotes and comments ignored.
  EXPECT_EQ(first(head + "tasks:\n  - {name: \"a[b\", kind: sleep  # not ] here\n  - name: u\n").substr(0, 15),
            "s.yaml:7:5: err");
  // `key:value` without a space: one plain string; the error is on that line, at the key.
  EXPECT_EQ(first("version: 1\nname: x\nsites:\n  - name: edge\n    engine:local\n    workers: 2\n"),
            "s.yaml:5:5: error: YAML syntax: 'engine:local' is one plain string, not a key and a value: put a space "
            "after the ':' (the parser gave up at 6:12: illegal map value)");
  // A second document: at its '---', also when the first one starts with '---' too.
  EXPECT_EQ(first("---\n" + head + "---\nversion: 1\n"),
            "s.yaml:7:1: error: (root): more than one YAML document ('---'); put one spec per file");
  // Syntax errors with nothing better to say keep yaml-cpp's position.
  EXPECT_EQ(first("version: 1\nname: [x\n").rfind("s.yaml:", 0), 0u);
  // A bracket that closes later is not blamed for an error inside it.
  EXPECT_EQ(first(head + "tasks:\n  - name: t\n    allowed_sites: [a, b, @c]\n").find("never closed"), std::string::npos);
  // An apostrophe inside a plain scalar does not hide a bracket left open after it.
  EXPECT_EQ(first(head + "tasks:\n  - name: t\n    allowed_sites: [it's, b\n    kind: sleep\n").substr(0, 42),
            "s.yaml:8:20: error: YAML syntax: end of se");
  // A sequence item `host:port` is a plain string on purpose: not taken for a missing space.
  EXPECT_EQ(first("version: 1\nname: x\npeers:\n  - node1:7443\n extra: 1\n").find("plain string"), std::string::npos);
}

// Errors found by the resilience engine's own checks (`diaspora validate` runs them) are
// at the value of the key at fault, like the schema's and the loader's.
TEST(Spec, PolicyEngineErrorsAreAtTheKeyAtFault) {
  auto r = load_spec_string(
      "version: 1\nname: x\nsites:\n  - name: edge\n    engine: local\ntasks:\n  - name: t\n    kind: sleep\n"
      "policies:\n  - name: p\n    signal: site.throughput\n    action: restart\n  - name: q\n"
      "    signal: task.step_time\n    detector: threshold\n    action: alert\n",
      "s.yaml");
  ASSERT_TRUE(r.ok()) << all_errors(r);
  try {
    diaspora::resilience::PolicyEngine engine(*r.spec);
    FAIL() << "the policies compiled";
  } catch (const diaspora::SpecError& e) {
    ASSERT_EQ(e.diagnostics().size(), 2u);
    // A key that is there: at its value. A key that is missing (threshold:): at the policy.
    EXPECT_EQ(e.diagnostics()[0].str().rfind("s.yaml:12:13: error: policies[0].action: policy 'p': ", 0), 0u)
        << e.diagnostics()[0].str();
    EXPECT_EQ(e.diagnostics()[1].str().rfind("s.yaml:13:5: error: policies[1].threshold: policy 'q': ", 0), 0u)
        << e.diagnostics()[1].str();
  }
}

TEST(Spec, ASiteMayHaveARelayOfItsOwnExceptASlurmSite) {
  auto r = load_spec_string(R"(version: 1
name: fed
relay: {url: "wss://centre:7443"}
sites:
  - name: a
    engine: local
    relay: {url: "wss://site-a:7443", failover: ["wss://site-a2:7443"], ca_file: ca.pem, token_file: a.jwt}
  - name: b
    engine: local
tasks:
  - {name: n, kind: sleep, args: {seconds: 1}}
)",
                            "fed.yaml");
  ASSERT_TRUE(r.ok()) << all_errors(r);
  const auto& a = r.spec->sites[0];
  ASSERT_TRUE(a.relay);
  EXPECT_EQ(a.relay->url, "wss://site-a:7443");
  EXPECT_EQ(a.relay->failover, std::vector<std::string>{"wss://site-a2:7443"});
  EXPECT_EQ(a.relay->ca_file, std::filesystem::path("ca.pem"));
  EXPECT_EQ(a.relay->token_file, std::filesystem::path("a.jwt"));
  EXPECT_FALSE(r.spec->sites[1].relay);
  auto slurm = load_spec_string(R"(version: 1
name: fed
sites:
  - name: a
    engine: slurm
    relay: {url: "wss://site-a:7443"}
tasks:
  - {name: n, kind: sleep, args: {seconds: 1}}
)",
                                "slurm.yaml");
  // A Slurm site may have its own relay too: its SPANK plugin publishes there
  // (test_adapters_slurm.py runs it).
  ASSERT_TRUE(slurm.ok()) << all_errors(slurm);
  ASSERT_TRUE(slurm.spec->sites[0].relay);
  EXPECT_EQ(slurm.spec->sites[0].relay->url, "wss://site-a:7443");
}
