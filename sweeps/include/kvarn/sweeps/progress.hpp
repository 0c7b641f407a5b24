// Sweep progress: on a terminal one self-overwriting line (bar, done/total, case, ETA); otherwise
// (CI, log files) one plain line per finished case with elapsed time and ETA.
#ifndef KVARN_SWEEPS_PROGRESS_HPP_
#define KVARN_SWEEPS_PROGRESS_HPP_

#include <chrono>
#include <cstdio>
#include <string>

namespace kvarn {

class Progress {
 public:
  // `total` cases of which `already_done` were finished before (resumed); tty: isatty(out).
  Progress(int total, int already_done, std::FILE* out);
  Progress(int total, int already_done, std::FILE* out, bool tty);
  void start_case(const std::string& label);
  void finish_case(const std::string& label);
  void finish();  // ends the terminal line
  static std::string format_duration(double seconds);

 private:
  double elapsed() const;
  double eta() const;
  void draw(const std::string& label);

  int total_, done_, resumed_, computed_ = 0;
  std::FILE* out_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kvarn

#endif  // KVARN_SWEEPS_PROGRESS_HPP_
