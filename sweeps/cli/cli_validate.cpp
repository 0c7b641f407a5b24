// `kvarn-eval validate CONFIG`: resolve a config and print its cases and a rough cost estimate.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "kvarn/sweeps/estimate.hpp"
#include "kvarn/sweeps/progress.hpp"

namespace kvarn {

namespace {

struct ValidateCliOptions {
  std::string config;
  std::vector<std::string> sets;
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", b, units[u]);
  return buf;
}

void run_validate(const ValidateCliOptions& o) {
  const SweepConfig cfg = load_config(o.config, o.sets);
  for (const std::string& n : cfg.notices) std::printf("%s\n", n.c_str());
  std::printf("config: %s (name %s, resolved hash %s)\n", o.config.c_str(), cfg.name.c_str(),
              cfg.hash.substr(0, 12).c_str());
  std::printf("run directory: %s\n", run_directory(cfg, 0, 1, false).string().c_str());
  const SweepEstimate e = estimate_sweep(cfg);
  for (std::size_t i = 0; i < cfg.data.captures.size(); ++i) {
    const CaptureSpec& cap = cfg.data.captures[i];
    std::printf(
        "data: %s/%s (%s, head_dim %d): captured before the cases by %s from %s, %zu "
        "prompt(s) of %s, generate %d, layers %s\n",
        run_directory(cfg, 0, 1, false).string().c_str(), capture_file(i).c_str(), cap.name.c_str(),
        cap.head_dim, cap.key.c_str(), cap.model.c_str(), cap.sequence_tokens.size(),
        cap.prompts.c_str(), cap.generate, cap.layers.c_str());
  }
  if (!cfg.data.captures.empty()) {
    std::printf("capture estimated %s, %s\n", Progress::format_duration(e.capture_seconds).c_str(),
                human_bytes(e.capture_bytes).c_str());
  }
  for (const TilesSource& t : cfg.data.tiles) {
    std::printf("data: %s (%s, head_dim %d, %s)\n", t.path.c_str(), t.name.c_str(), t.head_dim,
                t.fingerprint.substr(0, 19).c_str());
  }
  std::printf("cases: %zu\n", cfg.cases.size());
  std::printf("  %-14s %-24s %8s  %s\n", "id", "name", "bits/el", "spec");
  for (const CaseSpec& c : cfg.cases) {
    std::printf("  %-14s %-24s %8.3f  %s\n", c.id.c_str(), c.name.c_str(), c.bits_per_element,
                c.spec.c_str());
  }
  std::printf(
      "estimate (rough: tokens x per-token cost per metric family, one core): %s, %s on "
      "disk (%lld slabs, %lld tokens per case)\n",
      Progress::format_duration(e.seconds).c_str(), human_bytes(e.bytes).c_str(),
      static_cast<long long>(e.slabs), static_cast<long long>(e.tokens));
}

}  // namespace

void add_validate_command(CLI::App& app) {
  auto o = std::make_shared<ValidateCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Resolve a sweep config: print the case list and a time/disk estimate, run nothing");
  cmd->add_option("config", o->config, "Sweep config (YAML)")->required();
  cmd->add_option("--set", o->sets, "Override a config field: key.path=value (repeatable)");
  cmd->callback([o] { run_validate(*o); });
}

}  // namespace kvarn
