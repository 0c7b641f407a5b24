// Runs the Python report generator (reports/kvarn_report.py) on a run directory.
#ifndef KVARN_SWEEPS_REPORT_HPP_
#define KVARN_SWEEPS_REPORT_HPP_

#include <filesystem>
#include <string>

namespace kvarn {

// The script: $KVARN_REPORT_SCRIPT, else reports/kvarn_report.py under the working directory or
// the source tree the binary was built from; empty when none exists.
std::filesystem::path find_report_script();

// `python3 SCRIPT RUN_DIR [--out OUT]`; returns its exit code (128 if it did not exit normally).
// Throws kvarn::Error when the script cannot be found.
int run_report(const std::filesystem::path& run_dir, const std::string& out_dir = "");

}  // namespace kvarn

#endif  // KVARN_SWEEPS_REPORT_HPP_
