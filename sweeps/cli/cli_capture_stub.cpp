// `kvarn-eval capture` in a build without the libtorch runner: the subcommand exists (so `--help`
// lists it) and fails with a message saying how to get it.
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

void add_capture_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "capture", "Capture real KV tiles from an HF checkpoint (needs the libtorch runner)");
  cmd->allow_extras();
  cmd->callback([] {
    fail(
        "capture: kvarn-eval was built without libtorch (the model runner); install torch "
        "(scripts/install_deps.sh) and configure with -DKVARN_ENABLE_TORCH=ON");
  });
}

}  // namespace kvarn
