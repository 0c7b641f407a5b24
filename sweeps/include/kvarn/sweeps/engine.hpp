// The sweep engine: runs every case of a resolved config into its run directory (store.hpp),
// resuming finished cases, optionally one shard of them, and regenerates the summaries.
//
// A case is one method over every selected (tiles, sequence, layer, KV head) slab: the method's
// quantize_sequence, eval's method_metrics (KVarN stages included) and, with captured queries,
// eval's attention_metrics. Metric definitions live in eval/ only; the engine only pools them
// over slabs (docs/results.md says how) and turns them into tidy summary rows.
#ifndef KVARN_SWEEPS_ENGINE_HPP_
#define KVARN_SWEEPS_ENGINE_HPP_

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvarn/sweeps/config.hpp"

namespace kvarn {

struct SweepOptions {
  int shard_index = 0, shard_count = 1;
  bool fresh = false;             // new run directory (suffix -2, -3, ...) instead of resuming
  std::vector<std::string> only;  // case ids or indices; empty: every case of the shard
  bool report = true;             // run reports/kvarn_report at the end (and config.report)
  bool strict_report = false;     // a missing or failing report is an error
  std::string command;            // the invoking command line (provenance)
  std::FILE* log = stderr;        // progress and notices
  int progress_tty = -1;          // -1: detect with isatty, 0: plain lines, 1: terminal bar
};

struct SweepResult {
  std::filesystem::path run_dir;
  int total = 0;       // cases in the config
  int selected = 0;    // cases of this shard / --only
  int computed = 0;    // computed by this invocation
  int resumed = 0;     // already finished before
  int finished = 0;    // finished cases in the run directory at the end
  int report_rc = -1;  // report script's exit status (-1: not run)
};

// <output>/<name>-<hash12>[-shard-i-of-n]; with `fresh`, the first of that, -2, -3 ... not taken.
std::filesystem::path run_directory(const SweepConfig& cfg, int shard_index, int shard_count,
                                    bool fresh);

// The command that recomputes one case of this config.
std::string reproduce_command(const SweepConfig& cfg, const std::string& case_id);

SweepResult run_sweep(const SweepConfig& cfg, const SweepOptions& opts);

// Computes one case: the record for cases/<id>.json (no timing, provenance or command) and, when
// `arrays_path` is not empty, its arrays file (written atomically).
nlohmann::json compute_case(const SweepConfig& cfg, const CaseSpec& cs,
                            const std::filesystem::path& arrays_path);

// Parses "i/n" (0 <= i < n).
std::pair<int, int> parse_shard(const std::string& text);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_ENGINE_HPP_
