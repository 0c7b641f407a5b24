// The kvarn-tiles v1 HDF5 reader on an in-memory file image: the structure walk first in the
// probe child (kvarn/data/h5_probe.hpp), then in-process structure checks and every slab and
// token id read (each value checked finite).
//
// A probe child that crashed is the reader's handled outcome only when the crash is libhdf5's:
// in sanitizer builds the child's report must put the first frame outside the sanitizer runtime
// and libc into libhdf5. A crash in the project's own code is a finding (abort).
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

namespace {

#ifdef KVARN_FUZZ_ASAN
bool runtime_frame(const std::string& function) {
  static const char* const kLibc[] = {"memcpy", "memmove", "memset", "memcmp",  "strlen",
                                      "strcmp", "malloc",  "calloc", "realloc", "free"};
  if (function.rfind("__", 0) == 0) return true;  // sanitizer interceptors, libc internals
  for (const char* name : kLibc) {
    if (function == name) return true;
  }
  return false;
}

// True when the first frame of the report's first stack, past the sanitizer runtime and libc,
// is in libhdf5.
bool crash_in_libhdf5(const std::string& report) {
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    const auto hash = line.find_first_not_of(' ');
    if (hash == std::string::npos || line[hash] != '#') continue;
    const auto in_pos = line.find(" in ");
    if (in_pos == std::string::npos) return line.find("libhdf5") != std::string::npos;
    std::string function = line.substr(in_pos + 4);
    function = function.substr(0, function.find_first_of(" ("));
    if (runtime_frame(function)) continue;
    return function.rfind("H5", 0) == 0 || line.find("libhdf5") != std::string::npos;
  }
  return false;
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
  // A libhdf5 loop is stopped after 0.25 s: a walk of these inputs takes a few milliseconds, and
  // mutations of a looping input loop too (at the default limit they would take the whole run).
  static const bool limit_set = (::setenv("KVARN_H5_PROBE_SECONDS", "0.25", 0), true);
  (void)limit_set;
  try {
    const kvarn::TileReader reader("fuzz-input.h5", data, size);
    reader.validate_values();
  } catch (const kvarn::Error& e) {
    check_probe_failure(e);
  }
  return 0;
}
