// Diaspora's exception base: one type carrying a message and where it was thrown.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace diaspora {

/// Base of every exception Diaspora throws. `what()` is the readable message; `where()`
/// is the throwing function's source location, for logs and bug reports.
///
/// @par Thread Safety
/// Immutable after construction; safe to read from any thread.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message,
                 std::source_location where = std::source_location::current())
      : std::runtime_error(message), where_(where) {}

  /// Source location of the throw site.
  const std::source_location& where() const noexcept { return where_; }

 private:
  std::source_location where_;
};

}  // namespace diaspora
