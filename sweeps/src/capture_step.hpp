// The sweep engine's `data.capture` step (docs/results.md, "Captured data"): before any case reads
// it, <run_dir>/capture_file(i) must hold a capture of exactly the i-th configured spec. It is made
// with eval's run_capture (temporary file + rename, so a kill leaves no file that looks complete),
// reused on resume when the spec hash it records matches, and never silently replaced once a case
// was computed from it. Internal to kvarn_sweeps.
#ifndef KVARN_SWEEPS_SRC_CAPTURE_STEP_HPP_
#define KVARN_SWEEPS_SRC_CAPTURE_STEP_HPP_

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "kvarn/sweeps/config.hpp"

namespace kvarn {

struct CaptureStep {
  bool available = false;  // false: not made, because no case needed it
  TilesSource tiles;       // the capture file as one data file of the run
  nlohmann::json provenance = nlohmann::json::object();  // provenance.json's "capture"
};

// `needed`: a case is still to compute (only then is a missing capture made). `cases_finished`:
// some case of the run directory is finished; then a missing, unreadable or mismatching capture
// file is an error instead of being (re)made, so results never mix two captures.
// Throws kvarn::Error; in a build without the runner, always (config validation prevents that).
CaptureStep prepare_capture(const SweepConfig& cfg, std::size_t index,
                            const std::filesystem::path& run_dir, bool needed, bool cases_finished,
                            const std::string& command, std::FILE* log);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_SRC_CAPTURE_STEP_HPP_
