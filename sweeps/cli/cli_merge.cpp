// `kvarn-eval merge OUT SHARD_DIR...`: combine shard run directories and regenerate summaries.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/sweeps/store.hpp"

namespace kvarn {

namespace {

struct MergeCliOptions {
  std::string out;
  std::vector<std::string> shards;
};

void run_merge(const MergeCliOptions& o) {
  std::vector<std::filesystem::path> dirs(o.shards.begin(), o.shards.end());
  const auto [done, total] = merge_runs(o.out, dirs);
  std::printf("%s: %d of %d cases\n", o.out.c_str(), done, total);
  if (done < total) {
    std::fprintf(stderr, "warning: merged run is incomplete (%d cases missing)\n", total - done);
  }
}

}  // namespace

void add_merge_command(CLI::App& app) {
  auto o = std::make_shared<MergeCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "merge", "Combine shard run directories (same resolved config) into one run");
  cmd->add_option("out", o->out, "Output run directory (created, or a run of the same config)")
      ->required();
  cmd->add_option("shards", o->shards, "Shard run directories")->required();
  cmd->callback([o] { run_merge(*o); });
}

}  // namespace kvarn
