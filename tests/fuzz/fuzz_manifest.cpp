// Fuzz target: a diaspora-train checkpoint's manifest.json as --resume reads it from disk
// (parse_manifest, rehearsal/src/manifest.hpp), before any rank file is trusted; read twice,
// without an identity check and with one that refuses another job's checkpoint (as the
// job's does). Invariants: only RehearsalError escapes; a manifest that parses holds a
// possible position (world size >= 1, no negative step, task, epoch or batch); the identity
// check sees what the manifest says was trained.
#include "diaspora/rehearsal.hpp"
#include "fuzz_support.hpp"
#include "manifest.hpp"

using namespace diaspora;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const bool refuse : {false, true}) {
    try {
      const auto m = rehearsal::detail::parse_manifest(text, "fuzz/manifest.json", [&](const auto& id) {
        if (refuse && id.strategy != "er") throw rehearsal::RehearsalError("another job's checkpoint");
      });
      FUZZ_CHECK(m.world_size >= 1 && m.step >= 0 && m.task >= 0 && m.epoch >= 0 && m.batch >= 0);
      FUZZ_CHECK(!refuse || m.strategy == "er");
    } catch (const rehearsal::RehearsalError& e) {
      FUZZ_CHECK(e.what()[0] != '\0');
    }
  }
  return 0;
}
