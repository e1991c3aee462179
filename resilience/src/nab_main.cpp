// diaspora-nab: run the default anomaly ensemble over every series CSV of a NAB-layout
// directory, strictly online (one pass per series, no look-ahead, no per-file settings),
// and write NAB result files. See docs/anomaly.md.
#include <CLI/CLI.hpp>

#include "diaspora/error.hpp"
#include "diaspora/files.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "diaspora/resilience.hpp"
#include "diaspora/version.hpp"

namespace fs = std::filesystem;
namespace res = diaspora::resilience;

namespace {

/// A bad input: printed as `FILE:LINE: message` (LINE 0: the whole file).
struct InputError {
  std::string file;
  std::size_t line;
  std::string message;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool parse_double(std::string_view s, double& out) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_int(std::string_view s, int& out) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
long long days_from_civil(long long y, unsigned m, unsigned d) {
  y -= m <= 2;
  const long long era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<long long>(doe) - 719468;
}

/// "YYYY-MM-DD HH:MM:SS[.fff]" (or 'T' separator, optional 'Z'), "YYYY-MM-DD", or a plain
/// number of seconds since the epoch. Seconds since 1970-01-01 in the stamp's own zone.
bool parse_timestamp(std::string_view s, double& out) {
  s = trim(s);
  if (!s.empty() && s.back() == 'Z') s.remove_suffix(1);
  if (s.size() >= 10 && s[4] == '-' && s[7] == '-') {
    int y, mo, d, h = 0, mi = 0;
    double sec = 0;
    if (!parse_int(s.substr(0, 4), y) || !parse_int(s.substr(5, 2), mo) || !parse_int(s.substr(8, 2), d))
      return false;
    if (mo < 1 || mo > 12 || d < 1 || d > 31) return false;
    if (s.size() > 10) {
      if ((s[10] != ' ' && s[10] != 'T') || s.size() < 19 || s[13] != ':' || s[16] != ':') return false;
      if (!parse_int(s.substr(11, 2), h) || !parse_int(s.substr(14, 2), mi) || !parse_double(s.substr(17), sec))
        return false;
      if (h > 23 || mi > 59 || sec < 0 || sec >= 61) return false;
    }
    out = static_cast<double>(days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d))) * 86400.0 +
          h * 3600.0 + mi * 60.0 + sec;
    return true;
  }
  return parse_double(s, out) && std::isfinite(out);
}

/// Splits one CSV line on commas (no quoting: NAB files have none).
void split(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  std::size_t start = 0;
  for (;;) {
    const auto comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma == std::string_view::npos ? line.npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
}

struct Row {
  std::string_view timestamp, value;
  double t, x;
};

/// Parses a series CSV (header with `timestamp` and `value` columns) from `text`.
/// Throws InputError on the first problem.
std::vector<Row> parse_series(const std::string& name, std::string_view text) {
  std::vector<Row> rows;
  std::vector<std::string_view> f;
  std::size_t line_no = 0, pos = 0;
  int ts_col = -1, val_col = -1;
  std::size_t ncols = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = trim(text.substr(pos, nl - pos));
    pos = nl + 1;
    ++line_no;
    if (line.empty()) continue;
    split(line, f);
    if (ts_col < 0) {
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (f[i] == "timestamp") ts_col = static_cast<int>(i);
        if (f[i] == "value") val_col = static_cast<int>(i);
      }
      if (ts_col < 0 || val_col < 0)
        throw InputError{name, line_no, "header must name a 'timestamp' and a 'value' column, got '" +
                                            std::string(line) + "'"};
      ncols = f.size();
      continue;
    }
    if (f.size() != ncols)
      throw InputError{name, line_no, "expected " + std::to_string(ncols) + " fields, got " + std::to_string(f.size())};
    Row r{f[static_cast<std::size_t>(ts_col)], f[static_cast<std::size_t>(val_col)], 0, 0};
    if (!parse_timestamp(r.timestamp, r.t))
      throw InputError{name, line_no, "bad timestamp '" + std::string(r.timestamp) +
                                          "' (want YYYY-MM-DD HH:MM:SS or seconds since the epoch)"};
    if (!parse_double(r.value, r.x) || !std::isfinite(r.x))
      throw InputError{name, line_no, "bad value '" + std::string(r.value) + "' (want a finite number)"};
    rows.push_back(r);
  }
  if (ts_col < 0) throw InputError{name, 0, "empty file (no header)"};
  if (rows.empty()) throw InputError{name, 0, "no data rows"};
  return rows;
}

/// A flat `key: value` file (a YAML mapping of numbers; '#' comments) over the defaults.
res::Ensemble::Config load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError{path, 0, "cannot open"};
  res::Ensemble::Config c;
  std::string line;
  std::size_t no = 0;
  std::vector<std::pair<std::string, std::size_t>> lines;  // key -> its line
  while (std::getline(in, line)) {
    ++no;
    std::string_view s = line;
    if (const auto hash = s.find('#'); hash != s.npos) s = s.substr(0, hash);
    s = trim(s);
    if (s.empty()) continue;
    const auto colon = s.find(':');
    if (colon == s.npos) throw InputError{path, no, "expected 'key: value'"};
    const auto key = trim(s.substr(0, colon));
    double v;
    if (!parse_double(s.substr(colon + 1), v) || !std::isfinite(v))
      throw InputError{path, no, "'" + std::string(key) + "' needs a number"};
    if (!res::set_config_field(c, key, v)) throw InputError{path, no, "unknown key '" + std::string(key) + "'"};
    lines.emplace_back(key, no);
  }
  // Checked with every optional detector on, so a bad setting of one that is off is found
  // too; the error ("Resonance: categories is out of range") names the key's line.
  res::Ensemble::Config all = c;
  if (all.context_weight == 0) all.context_weight = 1;
  if (all.resonance_weight == 0) all.resonance_weight = 1;
  try {
    res::Ensemble check(all);
  } catch (const std::exception& e) {
    static constexpr std::pair<std::string_view, std::string_view> kSections[] = {
        {"Ensemble", ""}, {"SeasonalForecaster", "forecaster."}, {"AnomalyLikelihood", "likelihood."},
        {"Cusum", "cusum."}, {"TailCalibrator", "calibration."}, {"ContextNovelty", "context."},
        {"Resonance", "resonance."}};
    const std::string_view what = e.what();
    std::size_t at = 0;
    for (const auto& [cls, prefix] : kSections) {
      if (what.substr(0, cls.size() + 2) != std::string(cls) + ": ") continue;
      const auto rest = what.substr(cls.size() + 2);
      const std::string key = std::string(prefix) + std::string(rest.substr(0, rest.find(' ')));
      for (const auto& [k, n] : lines)
        if (k == key) at = n;
    }
    throw InputError{path, at, std::string(what)};
  }
  return c;
}

/// What NAB's detector API hands every detector before a series (its min and max, its
/// probationary period: 15 % of it, at most 750 observations), given to the detectors
/// that use them (docs/anomaly.md, "Adaptive resonance").
res::Ensemble::Config with_nab_hints(res::Ensemble::Config c, const std::vector<Row>& rows) {
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.x < b.x; });
  const std::uint64_t probation = std::min<std::uint64_t>(rows.size() * 15 / 100, 750);
  c.resonance = res::Resonance::for_probation(probation, c.resonance);
  c.resonance.lower = lo->x;
  c.resonance.upper = hi->x;
  return c;
}

std::string read_input(const fs::path& p) {
  try {
    return diaspora::read_file(p);
  } catch (const diaspora::Error&) {
    throw InputError{p.string(), 0, "cannot read"};
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"diaspora-nab: run Diaspora's default streaming anomaly ensemble over every series CSV\n"
               "(<category>/<file>.csv with timestamp,value) under --data, strictly online, and write\n"
               "NAB result files (timestamp,value,anomaly_score) under --out. See docs/anomaly.md.",
               "diaspora-nab"};
  app.set_version_flag("--version", std::string("diaspora-nab ") + diaspora::version_string);
  std::string data_dir, out_dir, config_file, explain_file;
  app.add_option("--data", data_dir, "Directory of series CSVs (searched recursively)")->required();
  app.add_option("--out", out_dir, "Output directory (mirrors --data's layout)")->required();
  app.add_option("--config", config_file, "Flat 'key: value' file overriding ensemble defaults (docs/anomaly.md)");
  app.add_option("--explain", explain_file, "Also write one line per alert (score >= alert_level) with its explanation");
  bool online = false;
  app.add_flag("--online", online,
               "Give the detectors nothing NAB's detector API hands over beforehand (each series' min, max and "
               "probationary period): the range is the range seen so far, the probation the default");
  std::string bad_side = "both";
  app.add_option("--bad-side", bad_side,
                 "Count only scores whose residual is on this side, as the policy engine's ensemble detector does "
                 "(up: above the forecast, e.g. a step time; down: below, e.g. a throughput; both: NAB's way)")
      ->check(CLI::IsMember({"up", "down", "both"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const int bad_dir = bad_side == "up" ? 1 : bad_side == "down" ? -1 : 0;
  res::Ensemble::Config config;
  try {
    if (!config_file.empty()) config = load_config(config_file);
  } catch (const InputError& e) {
    std::cerr << e.file << ":" << e.line << ": " << e.message << "\n";
    return 2;
  }

  std::error_code ec;
  if (!fs::is_directory(data_dir, ec)) {
    std::cerr << "diaspora-nab: error: --data " << data_dir << " is not a directory\n";
    return 2;
  }
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(data_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".csv") files.push_back(it->path());
  }
  if (ec) {
    std::cerr << "diaspora-nab: error: listing " << data_dir << ": " << ec.message() << "\n";
    return 1;
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::cerr << "diaspora-nab: error: no .csv files under " << data_dir << "\n";
    return 2;
  }

  std::ofstream explain_out;
  if (!explain_file.empty()) {
    explain_out.open(explain_file);
    if (!explain_out) {
      std::cerr << "diaspora-nab: error: cannot write " << explain_file << "\n";
      return 1;
    }
  }

  int bad_inputs = 0, io_errors = 0;
  std::size_t series = 0, observations = 0;
  std::string out_text;
  for (const auto& file : files) {
    const fs::path rel = fs::relative(file, data_dir);
    std::string text;
    std::vector<Row> rows;
    try {
      text = read_input(file);
      rows = parse_series(file.string(), text);
    } catch (const InputError& e) {
      std::cerr << e.file << ":" << e.line << ": " << e.message << "\n";
      ++bad_inputs;
      continue;
    }
    res::Ensemble ensemble(online ? config : with_nab_hints(config, rows));
    out_text.clear();
    out_text.reserve(rows.size() * 48);
    out_text += "timestamp,value,anomaly_score\n";
    char buf[32];
    for (const auto& r : rows) {
      const res::Score s = ensemble.update(r.t, r.x);
      const double score = res::bad_side_score(s, bad_dir);
      out_text.append(r.timestamp).append(",").append(r.value).append(",");
      const int n = std::snprintf(buf, sizeof buf, "%.6f\n", score);
      out_text.append(buf, static_cast<std::size_t>(n));
      if (explain_out.is_open() && score >= config.alert_level)
        explain_out << rel.generic_string() << ":" << s.index + 2 << ": " << r.timestamp << " " << res::explain(s) << "\n";
    }
    const fs::path dest = fs::path(out_dir) / rel;
    fs::create_directories(dest.parent_path(), ec);
    std::ofstream out(dest, std::ios::binary);
    out << out_text;
    out.close();
    if (ec || !out) {
      std::cerr << "diaspora-nab: error: cannot write " << dest.string() << "\n";
      ++io_errors;
      continue;
    }
    ++series;
    observations += rows.size();
  }
  std::cerr << "diaspora-nab: " << series << " series, " << observations << " observations scored";
  if (bad_inputs) std::cerr << "; " << bad_inputs << " bad input file(s) skipped";
  std::cerr << "\n";
  if (bad_inputs) return 2;
  return io_errors ? 1 : 0;
}
