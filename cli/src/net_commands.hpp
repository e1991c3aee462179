// `diaspora publish`, `tail`, `put` and `get`: talk to a relay with the diaspora.v1 protocol.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace diaspora::cli {

/// Adds `publish`, `tail`, `put` and `get` to the app; returns the function that runs whichever was
/// parsed (returns -1 when neither was). Exit codes as in main.cpp.
std::function<int()> add_net_commands(CLI::App& app);

}  // namespace diaspora::cli
