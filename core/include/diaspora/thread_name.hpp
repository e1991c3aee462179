// Names for the threads Diaspora starts, so that `top -H`, `perf` and debuggers tell the
// relay's writer from its syncers and the plugin's publisher from the engine's threads.
#pragma once

#include <string_view>

namespace diaspora {

/// Names the calling thread `name` (Linux keeps the first 15 bytes; longer names are cut).
/// Any thread may call it for itself; failures are ignored (a name is a diagnostic aid).
void name_this_thread(std::string_view name) noexcept;

}  // namespace diaspora
