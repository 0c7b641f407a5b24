// `kvarn-eval compare BASE NEW`: regression check of two runs; exit 1 on a regression.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "kvarn/sweeps/compare.hpp"
#include "kvarn/sweeps/store.hpp"

namespace kvarn {

namespace {

struct CompareCliOptions {
  std::string base, now, tolerance = kDefaultTolerance;
  bool json = false;
};

void run_compare(const CompareCliOptions& o) {
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
  cmd->add_option("new", o->now, "New run directory (or its summary.jsonl)")->required();
  cmd->add_option("--tolerance", o->tolerance,
                  "Per-family tolerances by metric-name prefix, e.g. "
                  "'default:rel=1e-6,abs=1e-9;nmse:rel=0.01;kl:rel=0.05,abs=1e-6'; add 'ci' "
                  "to flag a row with a bootstrap CI only when the new value leaves the base "
                  "run's CI, e.g. 'ci;default:rel=1e-6'")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the comparison as JSON");
  cmd->callback([o] { run_compare(*o); });
}

}  // namespace kvarn
