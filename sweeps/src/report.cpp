#include "kvarn/sweeps/report.hpp"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"

#ifndef KVARN_SOURCE_ROOT
#define KVARN_SOURCE_ROOT ""
#endif

namespace kvarn {

namespace fs = std::filesystem;

fs::path find_report_script() {
  if (const char* env = std::getenv("KVARN_REPORT_SCRIPT")) return env;
  const std::string root = KVARN_SOURCE_ROOT;
  std::error_code ec;
  for (const fs::path& p :
       {fs::path("reports/kvarn_report.py"), fs::path(root) / "reports" / "kvarn_report.py"}) {
    if (!p.empty() && fs::is_regular_file(p, ec)) return p;
  }
  return {};
}

int run_report(const fs::path& run_dir, const std::string& out_dir) {
  const fs::path script = find_report_script();
  KVARN_CHECK(!script.empty(),
              "report: reports/kvarn_report.py not found (set KVARN_REPORT_SCRIPT)");
  std::string cmd = "python3 " + shell_quote(script.string()) + " " + shell_quote(run_dir.string());
  if (!out_dir.empty()) cmd += " --out " + shell_quote(out_dir);
  std::fflush(stdout);
  std::fflush(stderr);
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace kvarn
