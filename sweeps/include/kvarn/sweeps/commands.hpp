// Subcommands of the kvarn-eval CLI. Each add_*_command registers one subcommand on the app;
// its callback throws kvarn::Error on bad input (main turns that into exit code 2).
#ifndef KVARN_SWEEPS_COMMANDS_HPP_
#define KVARN_SWEEPS_COMMANDS_HPP_

#include <CLI/CLI.hpp>
#include <string>

namespace kvarn {

inline constexpr const char* kKvarnEvalVersion = "0.1.0";

// `kvarn-eval methods`: every registered method with its exact storage accounting.
void add_methods_command(CLI::App& app);
// `kvarn-eval quantize`: runs a method over a tile file and writes the stored fields.
void add_quantize_command(CLI::App& app);

// The command line as one string (for provenance records); set by main().
void set_command_line(int argc, char** argv);
const std::string& command_line();

}  // namespace kvarn

#endif  // KVARN_SWEEPS_COMMANDS_HPP_
