// Models loaded once per process: every case and every runner section (accumulation, quality,
// retrieval) of a sweep reuses the same Runner for a (checkpoint, device, threads) triple, so a
// model is read from disk once however many sections use it. Runner-only (needs the runner).
#ifndef KVARN_SWEEPS_RUNNER_CACHE_HPP_
#define KVARN_SWEEPS_RUNNER_CACHE_HPP_

#include <filesystem>
#include <string>

#include "kvarn/runner/runner.hpp"

namespace kvarn {

// The process-wide Runner of `checkpoint` on `device` with `threads` intra-op threads (0: torch's
// default), opened on first use. Not thread-safe: the engine runs cases one at a time.
const Runner& shared_runner(const std::filesystem::path& checkpoint, const std::string& device,
                            int threads);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_RUNNER_CACHE_HPP_
