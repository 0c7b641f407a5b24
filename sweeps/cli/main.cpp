// kvarn-eval: a thin shell over the libraries. Every subcommand lives in its own cli_*.cpp and is
// registered here; library errors (kvarn::Error) become one line on stderr and exit code 2.
#include <exception>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "kvarn/data/error.hpp"

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
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // usage errors are bad input too
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
  }
  return 0;
}
