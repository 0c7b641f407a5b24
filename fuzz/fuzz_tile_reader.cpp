// The kvarn-tiles v1 HDF5 reader on an in-memory file image: the structure walk in the probe
// child (kvarn/data/h5_probe.hpp), which sends the structure back, then in process every slab
// and token id read (each value checked finite).
//
// A probe child that crashed is the reader's handled outcome only when the crash is libhdf5's:
// in sanitizer builds the child's report must show a libhdf5 frame before any frame of the
// project's code. A crash in the project's own code is a finding (abort).
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "fuzz_util.hpp"
#include "kvarn/data/h5_probe.hpp"
#include "kvarn/data/tile_file.hpp"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVARN_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVARN_FUZZ_ASAN 1
#endif
#ifdef KVARN_FUZZ_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace {

#ifdef KVARN_FUZZ_ASAN
// True when, in the report's first stack, a libhdf5 frame comes before any frame of the
// project's code (kvarn::), frame #0 not counted.
bool crash_in_libhdf5(const std::string& report) {
  std::istringstream in(report);
  bool in_stack = false;
  for (std::string line; std::getline(in, line);) {
    const auto hash = line.find_first_not_of(' ');
    const bool frame = hash != std::string::npos && line[hash] == '#';
    if (!frame) {
      if (in_stack) return false;  // end of the first stack
      continue;
    }
    in_stack = true;
    // Frame #0 (the faulting instruction or an interceptor) is misnamed by the symbolizer of a
    // forked child at times, as a project function; the caller decides.
    if (line.compare(hash, 3, "#0 ") == 0) continue;
    const auto in_pos = line.find(" in ");
    const std::string function = in_pos == std::string::npos ? "" : line.substr(in_pos + 4);
    if (line.find("libhdf5") != std::string::npos || function.rfind("H5", 0) == 0) return true;
    if (function.find("kvarn::") != std::string::npos) return false;
  }
  return false;
}

// Starts the sanitizer's symbolizer in this process before the first probe child is forked: every
// child then inherits it (its pipes and its loaded symbol tables) instead of starting one of its
// own to symbolize its crash report (that start was most of the cost of each libhdf5 crash). The
// children use it one at a time, while this process waits for them.
void start_symbolizer() {
  char buf[256];
  __sanitizer_symbolize_pc(reinterpret_cast<void*>(&crash_in_libhdf5), "%p %F %L", buf,
                           sizeof(buf));
}

#endif

void check_probe_failure(const kvarn::Error& e) {
#ifdef KVARN_FUZZ_ASAN
  const std::string what = e.what();
  if (what.find("libhdf5 crashed") == std::string::npos &&
      what.find("libhdf5 failed") == std::string::npos) {
    return;
  }
  const std::string& report = kvarn::h5::last_probe_report();
  if (crash_in_libhdf5(report)) return;
  std::cerr << "the probe child crashed outside libhdf5: " << what << "\n" << report << "\n";
  std::abort();
#else
  (void)e;  // no sanitizer report to tell where: every probe failure is the handled outcome
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A libhdf5 loop is stopped after 0.05 s of the probe child's CPU time: a walk of these inputs
  // takes a few milliseconds, and mutations of a looping input loop too (at the default limit
  // they would take the whole run).
  static const bool limit_set = (::setenv("KVARN_H5_PROBE_SECONDS", "0.05", 0), true);
  (void)limit_set;
#ifdef KVARN_FUZZ_ASAN
  static const bool symbolizer_started = (start_symbolizer(), true);
  (void)symbolizer_started;
#endif
  try {
    const kvarn::TileReader reader("fuzz-input.h5", data, size);
    reader.validate_values();
  } catch (const kvarn::Error& e) {
    check_probe_failure(e);
  }
  return 0;
}
