#include "kvarn/data/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace fs = std::filesystem;

fs::path temp_path_for(const fs::path& path) {
  return path.parent_path() /
         (path.filename().string() + ".tmp." + std::to_string(static_cast<long>(::getpid())));
}

namespace {
void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace

void write_atomically(const fs::path& path, const std::function<void(const fs::path&)>& write,
                      bool overwrite) {
  KVARN_CHECK(overwrite || !fs::exists(path), path.string(),
              ": refusing to overwrite an existing file");
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path());
  const fs::path tmp = temp_path_for(path);
  try {
    write(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  commit_temp_file(tmp, path, true);
}

void commit_temp_file(const fs::path& tmp, const fs::path& path, bool overwrite) {
  std::error_code ec;
  if (!overwrite && fs::exists(path)) {
    fs::remove(tmp, ec);
    fail(path.string(), ": refusing to overwrite an existing file");
  }
  fsync_path(tmp);
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail(path.string(), ": cannot move the finished file into place: ", ec.message());
  }
  if (!path.parent_path().empty()) fsync_path(path.parent_path());
}

std::string utc_timestamp() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void write_text_atomically(const fs::path& path, const std::string& text, bool overwrite) {
  write_atomically(
      path,
      [&](const fs::path& tmp) {
        std::ofstream os(tmp, std::ios::binary);
        KVARN_CHECK(os.good(), tmp.string(), ": cannot open for writing");
        os << text;
        os.flush();
        KVARN_CHECK(os.good(), tmp.string(), ": write failed");
      },
      overwrite);
}

}  // namespace kvarn
