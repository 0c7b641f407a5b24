// Progress display of a sweep (see progress.hpp).
#include "kvarn/sweeps/progress.hpp"

#include <unistd.h>

#include <cmath>

namespace kvarn {

namespace {
constexpr int kBarWidth = 24;
constexpr std::size_t kLabelWidth = 40;
}  // namespace

Progress::Progress(int total, int already_done, std::FILE* out)
    : Progress(total, already_done, out, ::isatty(::fileno(out)) != 0) {}

Progress::Progress(int total, int already_done, std::FILE* out, bool tty)
    : total_(total),
      done_(already_done),
      resumed_(already_done),
      out_(out),
      tty_(tty),
      start_(std::chrono::steady_clock::now()) {}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

// Mean time of the cases computed in this invocation times the cases left (resumed ones are free).
double Progress::eta() const {
  if (computed_ == 0) return NAN;
  return elapsed() / computed_ * (total_ - done_);
}

std::string Progress::format_duration(double s) {
  if (!std::isfinite(s)) return "?";
  char buf[32];
  const long t = std::lround(s);
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  }
  return buf;
}

void Progress::draw(const std::string& label) {
  const int filled = total_ > 0 ? kBarWidth * done_ / total_ : kBarWidth;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kBarWidth, '.');
  std::string l = label.size() > kLabelWidth ? label.substr(0, kLabelWidth - 3) + "..." : label;
  std::fprintf(out_, "\r[%s] %d/%d %-*s ETA %-8s\x1b[K", bar.c_str(), done_, total_,
               static_cast<int>(kLabelWidth), l.c_str(), format_duration(eta()).c_str());
  std::fflush(out_);
}

void Progress::start_case(const std::string& label) {
  if (tty_) draw(label);
}

void Progress::finish_case(const std::string& label) {
  ++done_;
  ++computed_;
  if (tty_) {
    draw(label);
    return;
  }
  std::fprintf(out_, "[%d/%d] %s done (elapsed %s, ETA %s)\n", done_, total_, label.c_str(),
               format_duration(elapsed()).c_str(), format_duration(eta()).c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (tty_) {
    draw("done");
    std::fprintf(out_, "\n");
  }
  std::fprintf(out_, "%d/%d cases finished (%d resumed) in %s\n", done_, total_, resumed_,
               format_duration(elapsed()).c_str());
  std::fflush(out_);
}

}  // namespace kvarn
