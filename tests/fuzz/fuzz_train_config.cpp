// Fuzz target: diaspora-train's config (load_trainer_config_string: YAML, the --set
// overrides, schemas/rehearsal.schema.json, the consistency checks). An input that starts
// with a line "--set KEY=VALUE" gives that override; the rest is the YAML.
// Invariant: only the documented SpecError escapes, with its diagnostics.
#include "diaspora/spec.hpp"
#include "diaspora/trainer.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view yaml(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  if (yaml.starts_with("--set ")) {
    const auto nl = yaml.find('\n');
    overrides.emplace_back(yaml.substr(6, nl == std::string_view::npos ? std::string_view::npos : nl - 6));
    yaml.remove_prefix(nl == std::string_view::npos ? yaml.size() : nl + 1);
  }
  try {
    const rehearsal::TrainerConfig c = rehearsal::load_trainer_config_string(yaml, "fuzz.yaml", overrides);
    FUZZ_CHECK(c.dataset.tasks >= 0);
  } catch (const SpecError& e) {
    FUZZ_CHECK(!e.diagnostics().empty());
  }
  return 0;
}
