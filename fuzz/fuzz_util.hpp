// Shared by the libFuzzer targets: inputs reach the parsers as files (the way users hand them
// over), and the only acceptable failure is kvarn::Error, the project's one-line error; any other
// exception escapes and libFuzzer reports it as a crash, like ASan/UBSan findings.
#ifndef KVARN_FUZZ_FUZZ_UTIL_HPP_
#define KVARN_FUZZ_FUZZ_UTIL_HPP_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kvarn/data/error.hpp"

namespace kvarn::fuzz {

// Where the scratch directory goes: $TMPDIR when set, else /dev/shm (memory) when there is one,
// else the system temp directory. Each input is written to a file, and on a disk file system
// (ext4) truncating and closing a written file writes it out: that was most of each input's time
// for the small parsers.
inline std::filesystem::path scratch_parent() {
  std::error_code ec;
  if (std::getenv("TMPDIR") == nullptr && std::filesystem::is_directory("/dev/shm", ec) &&
      ::access("/dev/shm", W_OK | X_OK) == 0) {
    return "/dev/shm";
  }
  return std::filesystem::temp_directory_path();
}

// A per-process scratch directory, removed when the process exits normally.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path =
        scratch_parent() / ("kvarn-fuzz-" + std::to_string(static_cast<long>(::getpid())));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes `data` to scratch_dir()/name (replacing it) and returns the path.
inline std::filesystem::path write_scratch(const std::string& name, const std::uint8_t* data,
                                           std::size_t size) {
  const std::filesystem::path p = scratch_dir() / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p;
}

inline std::string as_string(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Runs `fn`; a kvarn::Error (bad input, reported cleanly) is the expected way to fail.
template <typename Fn>
void expect_clean(Fn&& fn) {
  try {
    fn();
  } catch (const kvarn::Error&) {
  }
}

}  // namespace kvarn::fuzz

#endif  // KVARN_FUZZ_FUZZ_UTIL_HPP_
