// `kvarn-eval report RUN_DIR [--out DIR]`: figures, tables, report.html and report.md of a run
// (the reports/kvarn_report package, Python + matplotlib).
#include <filesystem>
#include <memory>
#include <string>

#include "commands.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/report.hpp"

namespace kvarn {

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
    const int rc = run_report(o->run_dir, o->out);
    if (rc != 0) throw CommandExit{rc};
  });
}

}  // namespace kvarn
