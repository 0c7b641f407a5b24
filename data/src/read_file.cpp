#include "kvarn/data/read_file.hpp"

#include <algorithm>
#include <fstream>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace fs = std::filesystem;

std::string read_regular_file(const fs::path& path, const char* what, std::uintmax_t max_bytes) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  KVARN_CHECK(!ec && fs::exists(st), path.string(), ": no such ", what);
  KVARN_CHECK(fs::is_regular_file(st), path.string(), ": not a regular file (a ", what,
              " must be a file, not a directory, pipe or device)");
  const std::uintmax_t size = fs::file_size(path, ec);
  KVARN_CHECK(!ec, path.string(), ": cannot read the size: ", ec.message());
  KVARN_CHECK(size <= max_bytes, path.string(), ": ", size, " bytes, more than the ", max_bytes,
              " a ", what, " may have");
  std::ifstream in(path, std::ios::binary);
  KVARN_CHECK(in.good(), path.string(), ": cannot open");
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  KVARN_CHECK(static_cast<std::uintmax_t>(in.gcount()) == size, path.string(), ": read ",
              in.gcount(), " of ", size, " bytes (the file changed while being read)");
  return text;
}

std::string line_column(const std::string& text, std::size_t offset) {
  offset = std::min(offset, text.size());
  const auto begin = text.begin(), at = text.begin() + static_cast<std::ptrdiff_t>(offset);
  const long line = 1 + std::count(begin, at, '\n');
  const std::size_t last_nl = offset == 0 ? std::string::npos : text.rfind('\n', offset - 1);
  const std::size_t col = last_nl == std::string::npos ? offset + 1 : offset - last_nl;
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

std::string without_tag(const std::string& what) {
  if (what.empty() || what[0] != '[') return what;
  const auto end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

}  // namespace kvarn
