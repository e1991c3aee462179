// plugin.h must also compile as C++ (with the project's warnings) and give C linkage.
#include "diaspora/plugin.h"

#include <type_traits>

static_assert(std::is_standard_layout_v<diaspora_task_info>);
static_assert(std::is_same_v<decltype(&diaspora_abi_version), uint32_t (*)()>);
