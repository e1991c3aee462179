// Fuzz target: a workflow spec's YAML (load_spec_string: YAML syntax, the schema, the
// cross-references) and the policy compiler behind it (check_policies, PolicyEngine).
// Invariants: nothing throws but the documented SpecError of PolicyEngine; a spec that does
// not load has at least one diagnostic, each with a message; the policy engine refuses a
// spec exactly when check_policies finds a problem.
#include "diaspora/policy.hpp"
#include "diaspora/spec.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  const SpecLoadResult r = load_spec_string(yaml, "fuzz.yaml");
  for (const auto& d : r.diagnostics) FUZZ_CHECK(!d.message.empty());
  if (!r.ok()) {
    FUZZ_CHECK(!r.diagnostics.empty());
  } else {
    const auto problems = resilience::check_policies(*r.spec);
    bool refused = false;
    try {
      resilience::PolicyEngine engine(*r.spec);
    } catch (const SpecError&) {
      refused = true;
    }
    FUZZ_CHECK(refused == !problems.empty());
  }
  return 0;
}
