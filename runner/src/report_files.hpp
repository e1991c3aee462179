// The run's report: report.json (the record: every instance, attempt, fault, action and
// reaction time; docs/run.md describes each field) and report.html (self-contained: a
// per-worker timeline of attempts with the faults and actions marked, and summary tables;
// no script, no request leaves the file).
#pragma once

#include <boost/json/object.hpp>

#include <filesystem>
#include <string>

namespace diaspora::runner {

/// Writes DIR/report.json, DIR/report.html and DIR/timeline.png from the report object
/// (atomically, each).
/// Throws diaspora::Error when a file cannot be written. Runner thread.
void write_report_files(const std::filesystem::path& dir, const boost::json::object& report);

/// The HTML page for a report object (exposed for tests).
std::string report_html(const boost::json::object& report);

/// timeline.png for a report object: the same per-worker timeline as the page, as PNG bytes.
std::string timeline_png(const boost::json::object& report);

}  // namespace diaspora::runner
