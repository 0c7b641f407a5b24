// `kvarn-eval compare BASE NEW`: regression check of two runs; exit 1 on a regression.
// `--paired`: paired bootstrap of the differences over the rows' units, between the two runs or
// (`--methods A B`) between two methods of one run (compare_paired.hpp).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/compare.hpp"
#include "kvarn/sweeps/compare_paired.hpp"
#include "kvarn/sweeps/store.hpp"

namespace kvarn {

namespace {

struct CompareCliOptions {
  std::string base, now, tolerance = kDefaultTolerance;
  bool json = false;
  bool paired = false;
  std::vector<std::string> methods, metrics;
  std::uint64_t seed = 0;
};

void run_paired(const CompareCliOptions& o) {
  KVARN_CHECK(o.methods.empty() || o.methods.size() == 2,
              "--methods: give two methods of the run, e.g. --methods kvarn_k4v2_g128 kivi_2bit");
  KVARN_CHECK(o.methods.empty() != o.now.empty(),
              o.methods.empty()
                  ? "--paired: give two run directories, or one run and --methods A B"
                  : "--methods compares two methods of ONE run: give one run directory");
  PairedOptions po;
  po.bootstrap.seed = o.seed;
  po.metrics = o.metrics;
  const PairedResult r =
      o.methods.empty()
          ? compare_paired_runs(load_run_units(o.base), load_run_units(o.now), po)
          : compare_paired_methods(load_run_units(o.base), o.methods[0], o.methods[1], po);
  if (o.json) {
    std::cout << r.to_json().dump(2) << "\n";
  } else {
    std::cout << format_paired_table(r);
  }
  std::cout.flush();
  if (r.regressed()) throw CommandExit{1};
}

void run_compare(const CompareCliOptions& o) {
  if (o.paired) return run_paired(o);
  KVARN_CHECK(!o.now.empty(),
              "compare: give the base and the new run (or --paired --methods A B "
              "with one run)");
  KVARN_CHECK(o.methods.empty() && o.metrics.empty(), "--methods and --metric need --paired");
  const CompareResult r = compare_runs(o.base, o.now, parse_tolerance(o.tolerance));
  if (o.json) {
    std::cout << r.to_json().dump(2) << "\n";
  } else {
    std::cout << format_compare_table(r);
  }
  // The summaries are what is compared; a differing resolved config (data fingerprint, method
  // specs) is worth a note, not a failure.
  namespace fs = std::filesystem;
  const fs::path ra = fs::path(o.base) / "resolved.json", rb = fs::path(o.now) / "resolved.json";
  if (fs::is_regular_file(ra) && fs::is_regular_file(rb)) {
    const std::string ha = resolved_hash(read_json_file(ra)),
                      hb = resolved_hash(read_json_file(rb));
    if (ha != hb) {
      std::cerr << "note: the runs' resolved configs differ (" << ha.substr(0, 12) << " vs "
                << hb.substr(0, 12) << ")\n";
    }
  }
  std::cout.flush();
  // main() maps every non-zero CLI status to 2 (bad input); a regression is the distinct 1.
  if (r.regressed()) throw CommandExit{1};
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto o = std::make_shared<CompareCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Compare two runs' summaries; exit 1 when a metric regresses beyond tolerance");
  cmd->add_option("base", o->base, "Baseline run directory (or its summary.jsonl)")->required();
  cmd->add_option("new", o->now,
                  "New run directory (or its summary.jsonl); left out with --paired --methods");
  cmd->add_option("--tolerance", o->tolerance,
                  "Per-family tolerances by metric-name prefix, e.g. "
                  "'default:rel=1e-6,abs=1e-9;nmse:rel=0.01;kl:rel=0.05,abs=1e-6'; add 'ci' "
                  "to flag a row with a bootstrap CI only when the new value leaves the base "
                  "run's CI, e.g. 'ci;default:rel=1e-6'")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the comparison as JSON");
  cmd->add_flag("--paired", o->paired,
                "Paired bootstrap of the differences over the units behind the rows' CIs (tile "
                "slabs, prompts): flag a difference only when its 95 % CI excludes 0; between "
                "two runs exit 1 when a flagged difference is a regression");
  cmd->add_option("--methods", o->methods,
                  "With --paired and one run: the two methods (names or specs) to compare, A - B")
      ->expected(2);
  cmd->add_option("--metric", o->metrics,
                  "With --paired: only metrics starting with this prefix (repeatable)");
  cmd->add_option("--seed", o->seed, "With --paired: the bootstrap seed")->capture_default_str();
  cmd->callback([o] { run_compare(*o); });
}

}  // namespace kvarn
