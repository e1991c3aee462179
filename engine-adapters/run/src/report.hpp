// The run's report: report.json (the record: every instance, attempt, fault, action and
// reaction time; docs/run.md describes each field) and report.html (self-contained: a
// per-worker timeline of attempts with the faults and actions marked, and summary tables;
// no script, no request leaves the file).
#pragma once

#include <boost/json/object.hpp>

#include <filesystem>

namespace diaspora::run {

/// Writes DIR/report.json and DIR/report.html from the report object (atomically, each).
/// Throws diaspora::Error when a file cannot be written. Runner thread.
void write_report_files(const std::filesystem::path& dir, const boost::json::object& report);

/// The HTML page for a report object (exposed for tests).
std::string report_html(const boost::json::object& report);

}  // namespace diaspora::run
