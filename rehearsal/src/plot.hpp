// A PNG line-chart writer (on core's diaspora/raster.hpp) used by the
// continual-learning trainer to draw its task accuracy matrix as curves.png.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace diaspora::rehearsal {

/// Writes `file` as an RGB PNG line chart (default 800x520) of a square task matrix:
/// matrix[i][j] = metric on task j after training task i (i, j in 0..T-1).
///
/// Drawn: one coloured line per evaluated task j over x = i, only for i >= j (entries with
/// j > i are ignored); non-finite entries (NaN, +-inf) are skipped, i.e. the line joins the
/// neighbouring finite points. A thick black "average" line of the mean of the finite entries
/// matrix[i][0..i] (rows with no finite entry are skipped). Axes with ticks, numbers and
/// light grid lines; x labelled "after task", `y_label` drawn horizontally above the y axis,
/// `title` at the top (scale 2); a legend "task 0".."task T-1", "average" (several columns
/// when T is large). Colours: 12 fixed distinct colours, then generated hues for j >= 12.
/// y range: [0, 1] when every finite drawn value is in [0, 1] (or none is finite), else
/// [min(0, 1.1*min), 1.1*max] (upper bound 1 when max <= 0). Text outside ASCII digits,
/// letters, space and `.,-_()/:%+=` is drawn as a box; text too long for the image is clipped.
///
/// Written with diaspora::write_file_atomic (`file` + ".tmp", fsync, rename, directory fsync).
///
/// Thread safety: reentrant (no shared state). Concurrent calls for the same `file` race on
/// the common ".tmp" name and must be serialised by the caller.
///
/// Errors: std::invalid_argument when the matrix is empty, not square (any row whose length
/// is not T), T > 64, width/height outside [320, 8192] x [240, 8192], or the image too small
/// to fit the chart and its legend. diaspora::Error (a std::runtime_error) whose message names
/// `file` when it cannot be written (the ".tmp" is removed).
void write_matrix_plot(const std::filesystem::path& file, const std::vector<std::vector<double>>& matrix,
                       const std::string& title, const std::string& y_label, int width = 800,
                       int height = 520);


}  // namespace diaspora::rehearsal
