// The spec as `diaspora run` uses it: loaded and checked like `diaspora validate` (schema,
// cross-references, the policies compiled), then `--set KEY=VALUE` overrides applied and
// checked again, then what the runner itself needs checked (engines it can drive, the
// built-in kinds' args, resources this host can give). Every problem is found before
// anything starts.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "diaspora/spec.hpp"

namespace diaspora::run {

struct SpecInput {
  WorkflowSpec spec;             ///< with the overrides applied (policies cleared by --no-policies)
  boost::json::value document;   ///< the same as JSON; paths made absolute; given to the plugin
  std::filesystem::path base_dir;  ///< the spec file's folder (relative paths resolve here)
};

/// Loads `file`, applies `sets` ("a.b[0].c=VALUE" or "tasks.NAME.key=VALUE"; VALUE is a
/// YAML scalar or flow collection) and, with `no_policies`, drops the policies.
/// On success returns the input; on failure returns nullopt and appends one line per
/// problem to `errors` ("FILE:LINE:COL: error: ...", "--set KEY=VALUE: error: ...").
/// Thread-safe.
std::optional<SpecInput> load_run_spec(const std::filesystem::path& file, const std::vector<std::string>& sets,
                                       bool no_policies, std::vector<std::string>& errors);

/// The instances a task makes: `count`, or a stream's floor(rate x duration) (duration
/// default 60 s). Pure: any thread.
long instances_of(const TaskSpec& ts);

}  // namespace diaspora::run
