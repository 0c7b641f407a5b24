// `kvarn-eval sweep CONFIG`: a thin shell over load_config() and run_sweep().
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"

namespace kvarn {

namespace {

struct SweepCliOptions {
  std::string config, shard;
  std::vector<std::string> sets, only;
  bool fresh = false, no_report = false, strict_report = false;
};

void run_sweep_command(const SweepCliOptions& o) {
  const SweepConfig cfg = load_config(o.config, o.sets);
  SweepOptions opts;
  if (!o.shard.empty()) std::tie(opts.shard_index, opts.shard_count) = parse_shard(o.shard);
  opts.fresh = o.fresh;
  for (const std::string& s : o.only) {
    // Accept comma-separated lists too.
    std::size_t start = 0;
    while (start <= s.size()) {
      const auto comma = s.find(',', start);
      const std::string id = s.substr(start, comma == std::string::npos ? comma : comma - start);
      if (!id.empty()) opts.only.push_back(id);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  opts.report = !o.no_report;
  opts.strict_report = o.strict_report;
  opts.command = command_line();
  const SweepResult r = run_sweep(cfg, opts);
  std::printf("%s\n", r.run_dir.string().c_str());
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto o = std::make_shared<SweepCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Run every case of a sweep config into its run directory (resumes finished cases)");
  cmd->add_option("config", o->config, "Sweep config (YAML, docs/config-schema.md)")->required();
  cmd->add_option("--set", o->sets,
                  "Override a config field before validation: key.path=value "
                  "(value parsed as YAML; list indices allowed; repeatable)");
  cmd->add_option("--shard", o->shard, "Run only cases with index % n == i, as i/n (e.g. 0/4)");
  cmd->add_option("--only", o->only, "Run only these case ids or indices (repeatable or a,b,c)");
  cmd->add_flag("--fresh", o->fresh, "Start a new run directory instead of resuming");
  cmd->add_flag("--no-report", o->no_report, "Do not run reports/kvarn_report at the end");
  cmd->add_flag("--strict-report", o->strict_report,
                "Fail when the report script is missing or fails (default: warn)");
  cmd->callback([o] { run_sweep_command(*o); });
}

}  // namespace kvarn
