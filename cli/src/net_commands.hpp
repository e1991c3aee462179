// `diaspora publish` and `diaspora tail`: talk to a relay with the diaspora.v1 protocol.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace diaspora::cli {

/// Adds `publish` and `tail` to the app; returns the function that runs whichever was
/// parsed (returns -1 when neither was). Exit codes as in main.cpp.
std::function<int()> add_net_commands(CLI::App& app);

}  // namespace diaspora::cli
