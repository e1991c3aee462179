// Runs a program installed beside the `diaspora` binary (git-style subcommands).
#pragma once

#include <string>
#include <vector>

namespace diaspora::cli {

/// Replaces this process with `program` from the directory of the running executable,
/// passing `args` after its name. Returns only on failure: prints why (the program missing,
/// with what builds it) and returns 1. `argv0` names this program in the message.
int exec_sibling(const std::string& program, const char* argv0, const std::vector<std::string>& args);

}  // namespace diaspora::cli
