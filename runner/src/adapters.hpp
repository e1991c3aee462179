// What the runner takes from the engine adapters' support library (processes, the line
// channel, the plugin loader), named in the runner's namespace.
#pragma once

#include "diaspora/plugin_loader.hpp"
#include "diaspora/process.hpp"

namespace diaspora::runner {

using adapters::describe_wait_status;
using adapters::find_program;
using adapters::LineChannel;
using adapters::load_plugin;
using adapters::parse_progress_line;
using adapters::PluginLibrary;
using adapters::process_stopped;
using adapters::ProgressLine;
using adapters::self_executable;
using adapters::signal_group;
using adapters::spawn;
using adapters::SpawnSpec;
using adapters::trainer_executable;

}  // namespace diaspora::runner
