// Progress and stats of a batch run on rank 0: a one-line progress bar on stderr (only
// when stderr is a terminal, redrawn at most 4 times a second) and the latency
// percentiles of the final stats line. Header-only: a few small functions.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace linnet {

/// The q-th percentile (q in [0, 100]) of `values` with linear interpolation between
/// the two nearest ranks (numpy.percentile's default). 0 for no values.
inline double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double at = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (at - static_cast<double>(lo));
}

/// "p50/p90/p99" of `values` in ms, one decimal each: "12.3/20.0/31.5".
inline std::string percentiles_ms(const std::vector<double>& values) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.1f/%.1f/%.1f", percentile(values, 50), percentile(values, 90),
                percentile(values, 99));
  return buf;
}

/// "\r[linnet-tp] done/total requests, tokens/s" on stderr while a batch runs. Draws
/// nothing unless enabled and stderr is a terminal (or `force`: under mpirun a rank's
/// stderr is a pipe even when mpirun's is a terminal); redraws at most every 250 ms
/// (and always for the last request).
class ProgressBar {
 public:
  /// @param label  what the count is of, e.g. "requests" or "requests of dp group 0".
  ProgressBar(size_t total, std::string label, bool enabled, bool force = false)
      : total_(total), label_(std::move(label)), enabled_(enabled && (force || ::isatty(2) == 1)) {}
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// One more request done, with `new_tokens` tokens.
  void add(size_t new_tokens) {
    ++done_;
    tokens_ += new_tokens;
    if (!enabled_) return;
    const auto now = Clock::now();
    if (drawn_ && done_ < total_ && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    drawn_ = true;
    const double s = std::chrono::duration<double>(now - start_).count();
    const int width = 30;
    const int filled = total_ ? static_cast<int>(width * done_ / total_) : width;
    std::fprintf(stderr, "\r[linnet-tp] [%s%s] %zu/%zu %s, %.1f tokens/s ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done_, total_, label_.c_str(),
                 s > 0 ? static_cast<double>(tokens_) / s : 0.0);
    std::fflush(stderr);
  }

  /// Ends the bar's line (once).
  void finish() {
    if (enabled_ && drawn_) std::fputc('\n', stderr);
    drawn_ = false;
    enabled_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  size_t total_, done_ = 0, tokens_ = 0;
  std::string label_;
  bool enabled_, drawn_ = false;
  Clock::time_point start_ = Clock::now(), last_ = start_;
};

}  // namespace linnet
