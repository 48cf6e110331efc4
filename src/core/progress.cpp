#include "core/progress.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <utility>

#include "core/error.h"

namespace arbiter {

namespace {

// A live '\r' line on the terminal that a status line must end first (one stderr per process).
std::atomic<bool> g_live_line{false};

// The terminal's live line is redrawn at most this often: faster is flicker, not news.
constexpr double kTtyInterval = 0.1;

// When the process last wrote a progress or status line (initialised at start-up). A plain
// line is due kProgressPlainInterval after the last line of any phase, not after its own
// meter's start: otherwise the silence before a meter's first line adds the time before the
// meter (loading a model) to the interval and the slowest update.
std::atomic<std::chrono::steady_clock::rep> g_last_line{std::chrono::steady_clock::now().time_since_epoch().count()};

void mark_line() { g_last_line = std::chrono::steady_clock::now().time_since_epoch().count(); }

double since_last_line() {
  const auto last = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(g_last_line.load()));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
}

std::string amount(int64_t n, Progress::Unit unit, const std::string& what) {
  if (unit == Progress::Unit::Bytes) return n >= 1000000000 ? strformat("%.2f GB", n / 1e9) : strformat("%.1f MB", n / 1e6);
  return std::to_string(n) + (what.empty() ? "" : " " + what);
}

std::string rate_text(double per_s, Progress::Unit unit, const std::string& what) {
  if (unit == Progress::Unit::Bytes) return strformat("%.1f MB/s", per_s / 1e6);
  return strformat("%.0f %s/s", per_s, what.empty() ? "items" : what.c_str());
}

}  // namespace

bool progress_is_tty() {
  static const bool tty = ::isatty(2) == 1;
  return tty;
}

void progress_note(const std::string& tag, const std::string& text) {
  if (g_live_line.exchange(false)) std::fputc('\n', stderr);
  std::fprintf(stderr, "[%s] %s\n", tag.c_str(), text.c_str());
  mark_line();
}

Progress::Progress(std::string tag, int64_t total, std::string what, Unit unit, bool enabled)
    : tag_(std::move(tag)), what_(std::move(what)), total_(total), unit_(unit), enabled_(enabled),
      t0_(std::chrono::steady_clock::now()), last_(t0_) {}

Progress::~Progress() {
  if (live_ && g_live_line.exchange(false)) std::fputc('\n', stderr);
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string Progress::line(int64_t done) const {
  const double t = elapsed_s();
  const double rate = t > 0 ? double(done) / t : 0;
  std::string s = "[" + tag_ + "] " + (unit_ == Unit::Bytes ? amount(done, unit_, what_) : std::to_string(done)) +
                  " / " + amount(total_, unit_, what_);
  if (total_ > 0) s += strformat(" (%.0f%%)", 100.0 * double(done) / double(total_));
  s += strformat(", %.1f s, ", t) + rate_text(rate, unit_, what_);
  if (rate > 0 && done < total_) s += strformat(", ETA %.0f s", double(total_ - done) / rate);
  return s;
}

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (progress_is_tty() ? std::chrono::duration<double>(now - last_).count() < kTtyInterval
                        : since_last_line() < kProgressPlainInterval)
    return;
  last_ = now;
  mark_line();
  if (progress_is_tty()) {
    std::fprintf(stderr, "\r%s   ", line(done).c_str());
    live_ = true;
    g_live_line = true;
  } else {
    std::fprintf(stderr, "%s\n", line(done).c_str());
  }
}

void Progress::finish(const std::string& suffix) {
  if (!enabled_) return;
  const double t = elapsed_s();
  std::string s = "[" + tag_ + "] done " + amount(total_, unit_, what_) + strformat(" in %.1f s", t);
  if (t > 0) s += ", " + rate_text(double(total_) / t, unit_, what_);
  if (!suffix.empty()) s += ", " + suffix;
  if (live_ && g_live_line.exchange(false)) std::fprintf(stderr, "\r%s   \n", s.c_str());
  else std::fprintf(stderr, "%s\n", s.c_str());
  live_ = false;
  mark_line();
}

}  // namespace arbiter
