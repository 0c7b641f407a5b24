// Runs the Python report generator (the reports/kvarn_report package) on a run directory.
#ifndef KVARN_SWEEPS_REPORT_HPP_
#define KVARN_SWEEPS_REPORT_HPP_

#include <filesystem>
#include <string>

namespace kvarn {

// The folder holding the package: $KVARN_REPORT_DIR, else reports/ under the working directory or
// the source tree the binary was built from; empty when none holds reports/kvarn_report.
std::filesystem::path find_report_script();

// `python3 -m kvarn_report RUN_DIR [--out OUT]` with that folder first on PYTHONPATH; returns its
// exit code (128 if it did not exit normally). Throws kvarn::Error when the package is not found.
int run_report(const std::filesystem::path& run_dir, const std::string& out_dir = "");

}  // namespace kvarn

#endif  // KVARN_SWEEPS_REPORT_HPP_
