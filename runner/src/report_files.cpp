#include "report_files.hpp"

#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "diaspora/files.hpp"
#include "diaspora/raster.hpp"
#include "report_json.hpp"

namespace diaspora::runner {

namespace json = boost::json;
using report_json::arr;
using report_json::num;
using report_json::str;

namespace {

std::string esc(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string fixed(double x, int digits = 1) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

/// Time-axis ticks for a run of `duration` seconds: a step of 1, 2 or 5 x 10^k giving 4 to
/// 10 ticks, each labelled with as many decimals as the step needs ("2.5s", not "2s").
std::vector<std::pair<double, std::string>> time_ticks(double duration) {
  std::vector<std::pair<double, std::string>> out;
  if (!(duration > 0)) return out;
  double step = std::pow(10.0, std::floor(std::log10(duration / 10)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (duration / (step * m) <= 10) {
      step *= m;
      break;
    }
  const int digits = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  for (int k = 0; k * step <= duration * (1 + 1e-9); ++k) out.emplace_back(k * step, fixed(k * step, digits) + "s");
  return out;
}

/// Where a fault's band ends: its end (a slow-task's is when its attempt ended), or the run's
/// end for one that lasts (a slow-site or stop-relay without `for:`), or a sliver for an
/// instant (kill-worker, hang-task).
double fault_band_end(const json::object& f, double start, double duration) {
  const double e = num(f, "end_s");
  if (e >= 0) return e;
  const std::string kind = str(f, "kind");
  if (kind == "slow-site" || kind == "stop-relay") return duration;
  return std::min(duration, start + duration / 200);
}

// An attempt's colour by outcome (the page uses its hex form).
Rgb outcome_colour(const std::string& outcome) {
  if (outcome == "completed") return {46, 125, 50};
  if (outcome == "failed") return {198, 40, 40};
  if (outcome == "stopped") return {239, 108, 0};
  if (outcome == "cancelled") return {117, 117, 117};
  return {21, 101, 192};  // running (at the end of an interrupted run)
}

std::string hex(Rgb c) {
  char b[8];
  std::snprintf(b, sizeof b, "#%02x%02x%02x", c.r, c.g, c.b);
  return b;
}

// The timeline's rows, shared by the page and the PNG: one per worker of each site, in the
// sites' order.
struct Lanes {
  std::vector<std::string> names;
  std::map<std::string, int> index;  ///< "site/worker-N" -> row

  explicit Lanes(const json::object& r) {
    for (const auto& s : arr(r, "sites")) {
      const auto& so = s.as_object();
      for (long i = 0; i < static_cast<long>(num(so, "workers", 1)); ++i) {
        const std::string name = str(so, "name") + "/worker-" + std::to_string(i);
        index[name] = static_cast<int>(names.size());
        names.push_back(name);
      }
    }
  }
  int size() const { return static_cast<int>(names.size()); }
  /// The row of an anomaly (report.json "anomalies"): the worker its task's attempt ran on
  /// at that time, else its site's first worker; -1 when neither is known.
  int anomaly_row(const json::object& r, const json::object& an) const {
    const double t = num(an, "t_s");
    const std::string task = str(an, "task");
    if (!task.empty())
      for (const auto& i : arr(r, "instances"))
        for (const auto& a : arr(i.as_object(), "attempts")) {
          const auto& ao = a.as_object();
          const double e = num(ao, "end_s");
          if (str(ao, "id") != task || num(ao, "start_s") < 0 || t < num(ao, "start_s") - 0.5 || (e >= 0 && t > e + 0.5))
            continue;
          if (auto it = index.find(str(ao, "worker")); it != index.end()) return it->second;
        }
    if (auto it = index.find(str(an, "site") + "/worker-0"); it != index.end()) return it->second;
    return -1;
  }
  /// An anomaly's colour: yellow (score 0) to dark red (score 1).
  static Rgb anomaly_colour(double score) {
    const double k = std::clamp(score, 0.0, 1.0);
    auto mix = [&](int a, int b) { return static_cast<std::uint8_t>(std::lround(a + (b - a) * k)); };
    return {mix(0xf9, 0x8e), mix(0xa8, 0x0e), mix(0x25, 0x0e)};
  }
  /// The rows [first, end) a fault's band covers: its site's workers for slow-site, else all.
  std::pair<int, int> fault_rows(const json::object& fault) const {
    int first = -1, last = -1;
    if (str(fault, "kind") == "slow-task") {  // "ID on SITE/worker-N": that worker's row
      const std::string target = str(fault, "target");
      const auto on = target.rfind(" on ");
      for (int i = 0; on != std::string::npos && i < size(); ++i)
        if (names[static_cast<std::size_t>(i)] == target.substr(on + 4)) return {i, i + 1};
    }
    if (str(fault, "kind") == "slow-site")
      for (int i = 0; i < size(); ++i)
        if (names[static_cast<std::size_t>(i)].starts_with(str(fault, "site") + "/")) {
          if (first < 0) first = i;
          last = i;
        }
    return first < 0 ? std::pair{0, size()} : std::pair{first, last + 1};
  }
};

}  // namespace

std::string report_html(const json::object& r) {
  const double duration = std::max(1.0, num(r, "duration_s", 1));
  const Lanes lanes(r);
  const int left = 170, width = 1000, lane_h = 18, top = 30;
  const int height = top + lanes.size() * lane_h + 40;
  auto x_of = [&](double t) { return left + static_cast<int>(std::lround(t / duration * width)); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + width + 20 << "' height='" << height
      << "' font-family='sans-serif' font-size='11'>\n";
  for (int i = 0; i < lanes.size(); ++i) {
    const int y = top + i * lane_h;
    svg << "<text x='4' y='" << y + 13 << "'>" << esc(lanes.names[static_cast<std::size_t>(i)]) << "</text>"
        << "<line x1='" << left << "' x2='" << left + width << "' y1='" << y + lane_h << "' y2='" << y + lane_h
        << "' stroke='#eee'/>\n";
  }
  // Faults: a shaded band over the lanes of their site (all lanes for the relay).
  for (const auto& f : arr(r, "faults")) {
    const auto& fo = f.as_object();
    const double s = num(fo, "start_s");
    if (s < 0) continue;
    const double e = fault_band_end(fo, s, duration);
    const std::string kind = str(fo, "kind");
    const auto [first, end] = lanes.fault_rows(fo);
    const int y0 = top + first * lane_h, y1 = top + end * lane_h;
    svg << "<rect x='" << x_of(s) << "' y='" << y0 << "' width='" << std::max(2, x_of(e) - x_of(s)) << "' height='"
        << y1 - y0 << "' fill='#ffcdd2' opacity='0.6'><title>" << esc(kind + " " + str(fo, "target")) << "</title></rect>"
        << "<text x='" << x_of(s) << "' y='" << top - 6 << "' fill='#b71c1c'>" << esc(kind) << "</text>\n";
  }
  for (const auto& i : arr(r, "instances")) {
    const auto& io = i.as_object();
    for (const auto& a : arr(io, "attempts")) {
      const auto& ao = a.as_object();
      const double s = num(ao, "start_s");
      if (s < 0) continue;
      double e = num(ao, "end_s");
      if (e < 0) e = duration;
      auto it = lanes.index.find(str(ao, "worker"));
      if (it == lanes.index.end()) continue;
      const int y = top + it->second * lane_h + 3;
      const std::string outcome = str(ao, "outcome");
      svg << "<rect x='" << x_of(s) << "' y='" << y << "' width='" << std::max(1, x_of(e) - x_of(s) - 1) << "' height='"
          << lane_h - 6 << "' fill='" << hex(outcome_colour(outcome)) << "'><title>"
          << esc(str(ao, "id") + " attempt " + str(ao, "number") + ": " + outcome + " (" + str(ao, "cause") + ") " +
                 str(ao, "reason"))
          << "</title></rect>\n";
    }
  }
  for (const auto& a : arr(r, "actions")) {
    const auto& ao = a.as_object();
    const double t = num(ao, "received_s");
    if (t < 0) continue;
    const int x = x_of(t), y = top + lanes.size() * lane_h + 4;
    svg << "<path d='M" << x << " " << y << " l-5 10 h10 z' fill='#6a1b9a'><title>"
        << esc(str(ao, "kind") + " " + str(ao, "task") + " -> " + str(ao, "target_site") + " (" + str(ao, "outcome") +
               "): " + str(ao, "reason"))
        << "</title></path>\n";
  }
  for (const auto& an : arr(r, "anomalies")) {  // the policies' anomaly scores, on the lane of what they saw
    const auto& o = an.as_object();
    const int row = lanes.anomaly_row(r, o);
    if (row < 0 || num(o, "t_s") < 0) continue;
    svg << "<circle cx='" << x_of(num(o, "t_s")) << "' cy='" << top + row * lane_h + lane_h / 2 << "' r='3.5' fill='"
        << hex(Lanes::anomaly_colour(num(o, "score", 0))) << "' stroke='#222' stroke-width='0.5'><title>"
        << esc("anomaly " + fixed(num(o, "score", 0), 2) + " (" + str(o, "detector") + ") " + str(o, "series") + ": " +
               str(o, "explanation"))
        << "</title></circle>\n";
  }
  for (const auto& [t, label] : time_ticks(duration))
    svg << "<text x='" << x_of(t) - 8 << "' y='" << height - 6 << "' fill='#555'>" << label << "</text>";
  svg << "</svg>";

  std::ostringstream h;
  const auto& sum = r.contains("summary") ? r.at("summary").as_object() : json::object();
  h << "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>" << esc(str(r, "workflow"))
    << " - Diaspora run report</title><style>body{font-family:sans-serif;margin:1.5em;color:#222}"
       "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;"
       "font-size:13px}th{background:#f3f3f3}.ok{color:#2e7d32}.bad{color:#c62828}</style></head><body>\n";
  h << "<h1>" << esc(str(r, "workflow")) << "</h1><p>spec " << esc(str(r, "spec")) << " &middot; mode "
    << esc(str(r, "mode")) << " &middot; " << fixed(duration) << " s &middot; exit status " << esc(str(r, "exit_status"))
    << "</p>\n<table><tr><th>instances</th><th>completed</th><th>failed</th><th>cancelled</th><th>attempts</th>"
       "<th>deadline misses</th><th>actions</th><th>reactions (mean / max s)</th></tr><tr>";
  const auto& rs = sum.contains("reactions") ? sum.at("reactions").as_object() : json::object();
  h << "<td>" << str(sum, "instances") << "</td><td class='ok'>" << str(sum, "completed") << "</td><td class='bad'>"
    << str(sum, "failed") << "</td><td>" << str(sum, "cancelled") << "</td><td>" << str(sum, "attempts") << "</td><td>"
    << str(sum, "deadline_misses") << " of " << str(sum, "with_deadline") << "</td><td>" << str(sum, "actions")
    << "</td><td>" << (rs.contains("mean_s") ? fixed(num(rs, "mean_s"), 2) + " / " + fixed(num(rs, "max_s"), 2) : "-")
    << "</td></tr></table>\n<h2>Timeline</h2><p>Bars: attempts (green completed, red failed, orange stopped by an "
       "action, grey cancelled); red bands: faults; purple marks: actions; dots: the policies' anomaly scores (yellow low, dark red 1). Hover for details.</p>\n"
    << svg.str() << "\n<h2>Faults</h2><table><tr><th>kind</th><th>at (s)</th><th>target</th><th>hit</th>"
                    "<th>reaction (s)</th></tr>";
  for (const auto& f : arr(r, "faults")) {
    const auto& fo = f.as_object();
    std::string hits, reacts;
    for (const auto& x : arr(fo, "hit")) {
      hits += (hits.empty() ? "" : ", ") + str(x.as_object(), "instance");
      const double re = num(x.as_object(), "reaction_s");
      reacts += (reacts.empty() ? "" : ", ") + (re >= 0 ? fixed(re, 2) : std::string("-"));
    }
    h << "<tr><td>" << esc(str(fo, "kind")) << "</td><td>" << fixed(num(fo, "start_s", 0)) << "</td><td>"
      << esc(str(fo, "target") + str(fo, "note")) << "</td><td>" << esc(hits) << "</td><td>" << reacts << "</td></tr>";
  }
  // Incidents: per instance, what hit it, the evidence, each decision and how it ended.
  h << "</table>\n<h2>Incidents</h2>";
  if (arr(r, "incidents").empty()) h << "<p>None: no fault hit an instance and no action named one.</p>";
  else
    h << "<table><tr><th>instance</th><th>fault</th><th>evidence</th><th>decisions</th><th>outcome</th></tr>";
  // One escaped line of a cell per item of `list`.
  auto lines = [](const json::array& list, auto text) {
    std::string cell;
    for (const auto& x : list) cell += (cell.empty() ? "" : "<br>") + esc(text(x.as_object()));
    return cell;
  };
  for (const auto& i : arr(r, "incidents")) {
    const auto& io = i.as_object();
    const std::string faults = lines(arr(io, "faults"), [](const json::object& f) {
      return str(f, "kind") + " at " + fixed(num(f, "start_s", 0)) + " s";
    });
    const std::string evidence = lines(arr(io, "evidence"), [](const json::object& e) {
      return fixed(num(e, "at_s", 0)) + " s: " + str(e, "what");
    });
    const std::string decisions = lines(arr(io, "decisions"), [](const json::object& d) {
      return fixed(num(d, "at_s", 0)) + " s: " + str(d, "kind") +
             (str(d, "target_site").empty() ? "" : " to " + str(d, "target_site")) + " (" + str(d, "policy") + ", " +
             str(d, "outcome") + ")";
    });
    const double re = num(io, "reaction_s"), dec = num(io, "decision_s"), rec = num(io, "recovering_attempt_running_s");
    std::string outcome = str(io, "state");
    if (rec >= 0) outcome += "; recovering attempt running at " + fixed(rec) + " s" +
                             (str(io, "recovering_site").empty() ? "" : " on " + str(io, "recovering_site"));
    if (dec >= 0) outcome += "; decided " + fixed(dec, 2) + " s after the fault";
    if (re >= 0) outcome += ", reaction " + fixed(re, 2) + " s";
    if (io.contains("budget_spent")) outcome += "; a budget was spent";
    h << "<tr><td>" << esc(str(io, "instance")) << "</td><td>" << (faults.empty() ? "none injected" : faults) << "</td><td>"
      << evidence << "</td><td>" << decisions << "</td><td class='" << (str(io, "state") == "completed" ? "ok" : "bad")
      << "'>" << esc(outcome) << "</td></tr>";
  }
  if (!arr(r, "incidents").empty()) h << "</table>";
  h << "\n<h2>Actions</h2><table><tr><th>at (s)</th><th>kind</th><th>task</th><th>to</th><th>outcome</th>"
       "<th>reason</th></tr>";
  for (const auto& a : arr(r, "actions")) {
    const auto& ao = a.as_object();
    h << "<tr><td>" << fixed(num(ao, "received_s", 0)) << "</td><td>" << esc(str(ao, "kind")) << "</td><td>"
      << esc(str(ao, "task")) << "</td><td>" << esc(str(ao, "target_site")) << "</td><td>"
      << esc(str(ao, "outcome") + (str(ao, "message").empty() ? "" : ": " + str(ao, "message"))) << "</td><td>"
      << esc(str(ao, "reason")) << "</td></tr>";
  }
  h << "</table>\n<h2>Instances</h2><table><tr><th>instance</th><th>state</th><th>attempts</th><th>sites</th>"
       "<th>time (s)</th><th>deadline</th></tr>";
  for (const auto& i : arr(r, "instances")) {
    const auto& io = i.as_object();
    std::string sites;
    for (const auto& a : arr(io, "attempts")) {
      const std::string s = str(a.as_object(), "site");
      if (!s.empty() && sites.find(s) == std::string::npos) sites += (sites.empty() ? "" : ", ") + s;
    }
    const double took = num(io, "end_s") >= 0 ? num(io, "end_s") - num(io, "submitted_s", 0) : -1;
    h << "<tr><td>" << esc(str(io, "id")) << "</td><td>" << esc(str(io, "state") + (str(io, "reason").empty() ? "" : ": " + str(io, "reason")))
      << "</td><td>" << arr(io, "attempts").size() << "</td><td>" << esc(sites) << "</td><td>"
      << (took >= 0 ? fixed(took) : "-") << "</td><td>"
      << (io.contains("deadline_met") ? (io.at("deadline_met").as_bool() ? "met" : "<span class='bad'>missed</span>") : "")
      << "</td></tr>";
  }
  h << "</table></body></html>\n";
  return h.str();
}

std::string timeline_png(const json::object& r) {
  const double duration = std::max(1.0, num(r, "duration_s", 1));
  const Lanes lanes(r);
  int label_w = 0;
  for (const auto& l : lanes.names) label_w = std::max(label_w, Raster::text_width(l, 1));
  const int lane_h = 16, top = 40, left = label_w + 16, width = std::max(640, left + 900);
  const int lanes_n = std::max(1, lanes.size());
  const int height = std::min(16000, top + lanes_n * lane_h + 64), right = width - 16;
  Raster c(width, height);
  auto x_of = [&](double t) { return left + static_cast<int>(std::lround(t / duration * (right - left))); };
  const Rgb black{0, 0, 0}, grid{225, 225, 225}, fault{255, 205, 210}, action{106, 27, 154};
  const int bottom = top + lanes_n * lane_h;
  for (const auto& f : arr(r, "faults")) {  // bands first, under the bars
    const auto& fo = f.as_object();
    const double s0 = num(fo, "start_s");
    if (s0 < 0) continue;
    const double e = fault_band_end(fo, s0, duration);
    const auto [first, end] = lanes.fault_rows(fo);
    const int y0 = top + first * lane_h, y1 = top + std::max(end, 1) * lane_h;
    c.fill_rect(x_of(s0), y0, std::max(2, x_of(e) - x_of(s0)), y1 - y0, fault);
    c.text(x_of(s0), top - 24, str(fo, "kind"), 1, {183, 28, 28});
  }
  for (int i = 0; i < lanes.size(); ++i) {
    const int y = top + i * lane_h;
    c.text(4, y + 4, lanes.names[static_cast<std::size_t>(i)], 1, black);
    c.line(left, y + lane_h, right, y + lane_h, grid);
  }
  for (const auto& i : arr(r, "instances"))
    for (const auto& a : arr(i.as_object(), "attempts")) {
      const auto& ao = a.as_object();
      const double s0 = num(ao, "start_s");
      auto it = lanes.index.find(str(ao, "worker"));
      if (s0 < 0 || it == lanes.index.end()) continue;
      double e = num(ao, "end_s");
      if (e < 0) e = duration;
      c.fill_rect(x_of(s0), top + it->second * lane_h + 3, std::max(1, x_of(e) - x_of(s0) - 1), lane_h - 6,
                  outcome_colour(str(ao, "outcome")));
    }
  for (const auto& a : arr(r, "actions")) {
    const double t = num(a.as_object(), "received_s");
    if (t < 0) continue;
    const int x = x_of(t);
    for (int k = 0; k < 8; ++k) c.line(x - k / 2, bottom + 4 + k, x + k / 2, bottom + 4 + k, action);
  }
  for (const auto& an : arr(r, "anomalies")) {
    const auto& o = an.as_object();
    const int row = lanes.anomaly_row(r, o);
    if (row < 0 || num(o, "t_s") < 0) continue;
    const int x = x_of(num(o, "t_s")), y = top + row * lane_h + lane_h / 2;
    c.fill_rect(x - 2, y - 2, 5, 5, Lanes::anomaly_colour(num(o, "score", 0)));
  }
  c.line(left, bottom, right, bottom, black);
  for (const auto& [t, label] : time_ticks(duration)) {
    c.line(x_of(t), bottom, x_of(t), bottom + 3, black);
    c.text(x_of(t) - Raster::text_width(label, 1) / 2, bottom + 16, label, 1, black);
  }
  const std::string title = str(r, "workflow") + ": attempts per worker (green completed, red failed, orange stopped, "
                            "grey cancelled), faults shaded, anomaly scores as dots, actions marked below";
  c.text(4, 6, title, 1, black);
  return c.png();
}

void write_report_files(const std::filesystem::path& dir, const json::object& report) {
  write_file_atomic(dir / "report.json", json::serialize(report) + "\n", 0644, Durability::file);
  write_file_atomic(dir / "report.html", report_html(report), 0644, Durability::file);
  write_file_atomic(dir / "timeline.png", timeline_png(report), 0644, Durability::file);
}

}  // namespace diaspora::runner
