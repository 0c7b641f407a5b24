// `kvarn-eval report RUN_DIR [--out DIR]`: figures, tables, report.html and report.md of a run
// (the reports/kvarn_report package, Python + matplotlib).
#include <filesystem>
#include <memory>
#include <string>

#include "commands.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/sweeps/compare.hpp"
#include "kvarn/sweeps/report.hpp"
#include "kvarn/sweeps/store.hpp"

namespace kvarn {

namespace {

// The run's summary and resolved config are checked here, so damage is one error line naming
// the file and line/key rather than a partial report.
void check_report_inputs(const std::filesystem::path& run) {
  const std::filesystem::path summary = run / "summary.jsonl", resolved = run / "resolved.json";
  if (std::filesystem::exists(summary)) {
    parse_summary_jsonl(read_regular_file(summary, "summary"), summary.string());
  }
  if (std::filesystem::exists(resolved)) {
    resolved_cases(read_json_file(resolved), resolved.string());
  }
}

}  // namespace

void add_report_command(CLI::App& app) {
  struct Options {
    std::string run_dir, out;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("report", "Write report.html/report.md, figures and tables of a run");
  cmd->add_option("run_dir", o->run_dir, "Run directory (holds summary.jsonl)")->required();
  cmd->add_option("--out", o->out, "Output directory (default RUN_DIR/report)");
  cmd->callback([o] {
    KVARN_CHECK(std::filesystem::is_directory(o->run_dir), o->run_dir, ": no such run directory");
    check_report_inputs(o->run_dir);
    const int rc = run_report(o->run_dir, o->out);
    if (rc != 0) throw CommandExit{rc};
  });
}

}  // namespace kvarn
