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

// The folder holding the kvarn_report package (reports/): $KVARN_REPORT_DIR, else reports/ under
// the working directory or the source tree the binary was built from.
fs::path find_report_script() {
  if (const char* env = std::getenv("KVARN_REPORT_DIR")) return env;
  const std::string root = KVARN_SOURCE_ROOT;
  std::error_code ec;
  for (const fs::path& p : {fs::path("reports"), fs::path(root) / "reports"}) {
    if (!p.empty() && fs::is_regular_file(p / "kvarn_report" / "__main__.py", ec)) {
      return fs::absolute(p, ec);
    }
  }
  return {};
}

int run_report(const fs::path& run_dir, const std::string& out_dir) {
  const fs::path dir = find_report_script();
  KVARN_CHECK(!dir.empty(), "report: reports/kvarn_report not found (set KVARN_REPORT_DIR)");
  // The source tree's package first, so a stale installed copy never shadows it.
  std::string cmd = "PYTHONPATH=" + shell_quote(dir.string()) +
                    "${PYTHONPATH:+:$PYTHONPATH} python3 -m kvarn_report " +
                    shell_quote(run_dir.string());
  if (!out_dir.empty()) cmd += " --out " + shell_quote(out_dir);
  std::fflush(stdout);
  std::fflush(stderr);
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace kvarn
