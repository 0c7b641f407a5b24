// Subcommands of the kvarn-eval CLI. Each add_*_command registers one subcommand on the app;
// its callback throws kvarn::Error on bad input (main turns that into exit code 2).
#ifndef KVARN_SWEEPS_CLI_COMMANDS_HPP_
#define KVARN_SWEEPS_CLI_COMMANDS_HPP_

#include <CLI/CLI.hpp>
#include <string>

#include "kvarn/sweeps/provenance.hpp"  // kKvarnEvalVersion

namespace kvarn {

// Thrown by a subcommand that must end with a specific exit code that is not an error (e.g.
// `compare` reports a regression with 1); main() returns the code, destructors run first.
struct CommandExit {
  int code;
};

// `kvarn-eval methods`: every registered method with its exact storage accounting.
void add_methods_command(CLI::App& app);
// `kvarn-eval quantize`: runs a method over a tile file and writes the stored fields.
void add_quantize_command(CLI::App& app);
// `kvarn-eval sweep`: runs a sweep config into its resumable run directory (docs/results.md).
void add_sweep_command(CLI::App& app);
// `kvarn-eval validate`: resolves a sweep config and prints cases and a cost estimate.
void add_validate_command(CLI::App& app);
// `kvarn-eval compare`: regression compare of two runs (exit 1 on a regression).
void add_compare_command(CLI::App& app);
// `kvarn-eval merge`: combines shard run directories.
void add_merge_command(CLI::App& app);
// `kvarn-eval capture`: real KV tiles from an HF checkpoint (needs the libtorch runner; without
// it the subcommand exists and says so).
void add_capture_command(CLI::App& app);

// `report RUN_DIR`: the Python report of a run directory.
void add_report_command(CLI::App& app);

// The command line as one string (for provenance records); set by main().
void set_command_line(int argc, char** argv);
const std::string& command_line();

}  // namespace kvarn

#endif  // KVARN_SWEEPS_CLI_COMMANDS_HPP_
