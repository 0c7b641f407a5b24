// kvarn-eval: a thin shell over the libraries. Every subcommand lives in its own cli_*.cpp and is
// registered here; library errors (kvarn::Error) become one line on stderr and exit code 2.
#include <exception>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"

namespace {
bool is_command(CLI::App& app, const char* name) {
  try {
    app.get_subcommand(name);
    return true;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}
}  // namespace

int main(int argc, char** argv) {
  kvarn::set_command_line(argc, argv);
  CLI::App app{"kvarn-eval: KV-cache quantization research harness (KVarN and baselines)"};
  app.require_subcommand(1);
  kvarn::add_methods_command(app);
  kvarn::add_quantize_command(app);
  kvarn::add_sweep_command(app);
  kvarn::add_validate_command(app);
  kvarn::add_compare_command(app);
  kvarn::add_merge_command(app);
  kvarn::add_report_command(app);
  kvarn::add_capture_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // Usage errors are bad input too: one error line, exit 2.
    if (argc > 1 && argv[1][0] != '-' && !is_command(app, argv[1])) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        names += (names.empty() ? "" : ", ") + sub->get_name();
      }
      std::cerr << "kvarn-eval: error: unknown command '" << argv[1] << "' (commands: " << names
                << ")\n";
      return 2;
    }
    std::cerr << "kvarn-eval: error: " << e.what() << " (kvarn-eval --help lists the commands, "
              << "kvarn-eval COMMAND --help their options)\n";
    return 2;
  } catch (const kvarn::CommandExit& e) {
    return e.code;
  } catch (const kvarn::Error& e) {
    std::cerr << "kvarn-eval: error: " << e.what() << "\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "kvarn-eval: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvarn-eval: internal error: " << e.what() << "\n";
    return 3;
  } catch (const H5::Exception& e) {  // not a std::exception: would otherwise abort
    std::cerr << "kvarn-eval: internal error: HDF5: " << kvarn::h5::describe(e) << "\n";
    return 3;
  }
  return 0;
}
