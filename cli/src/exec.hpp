// Runs a program installed beside the `diaspora` binary (git-style subcommands).
#pragma once

#include <string>
#include <vector>

namespace diaspora::cli {

/// Replaces this process with `program` from the directory of the running executable,
/// passing `args` after its name. Returns only on failure: prints why (with `missing_hint`,
/// what builds it, when the program is missing) and returns 1. `argv0` locates this program
/// when /proc is unavailable.
int exec_sibling(const std::string& program, const char* argv0, const std::vector<std::string>& args,
                 const std::string& missing_hint);

}  // namespace diaspora::cli
