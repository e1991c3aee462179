// Fuzz target: relay.yaml (load_relay_config: the YAML, the schema relay.schema.json, the
// values read from it) and the checks diaspora-relay runs on it before it starts
// (validate_relay_config). Invariants: only the documented SpecError and RelayConfigError
// escape, each with a message.
#include "diaspora/files.hpp"
#include "diaspora/relay.hpp"
#include "diaspora/spec.hpp"
#include "fuzz_support.hpp"

using namespace diaspora;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path file = fuzz::scratch_dir() / "relay.yaml";
  write_file_atomic(file, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const RelayConfig config = load_relay_config(file);
    validate_relay_config(config);
  } catch (const SpecError& e) {
    FUZZ_CHECK(!e.diagnostics().empty());
  } catch (const RelayConfigError& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
  }
  return 0;
}
