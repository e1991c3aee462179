#include "exec.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <system_error>

namespace diaspora::cli {

int exec_sibling(const std::string& program, const char* argv0, const std::vector<std::string>& args,
                 const std::string& missing_hint) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path path = (ec ? std::filesystem::path(argv0) : self).parent_path() / program;
  std::vector<char*> argv;
  std::string name = program;
  argv.push_back(name.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Without /proc, a bare argv[0] (found on PATH) has no folder: search PATH for the program.
  if (path.has_parent_path()) ::execv(path.c_str(), argv.data());
  else ::execvp(program.c_str(), argv.data());
  const int err = errno;
  std::cerr << "error: cannot run " << path.string() << ": " << std::strerror(err)
            << (err == ENOENT ? " (" + missing_hint + ")" : std::string())
            << "\n";
  return 1;
}

}  // namespace diaspora::cli
