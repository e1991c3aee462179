// `diaspora bench relay`.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace diaspora::cli {

/// Adds `bench relay`; returns the function that runs it when parsed (else returns -1).
std::function<int()> add_bench_commands(CLI::App& app);

}  // namespace diaspora::cli
