// Bounded whole-file reads for every text input (JSON, JSONL): only regular files are read (a
// FIFO or device such as /dev/zero is an endless stream), and a file larger than the caller's
// bound is refused before anything is allocated, with both sizes in the message.
#ifndef KVARN_DATA_READ_FILE_HPP_
#define KVARN_DATA_READ_FILE_HPP_

#include <cstdint>
#include <filesystem>
#include <string>

namespace kvarn {

// 1 GiB: far above any config, tokenizer, prompt file or run-directory record the project reads.
inline constexpr std::uintmax_t kMaxTextFileBytes = std::uintmax_t{1} << 30;

// The bytes of `path`; throws kvarn::Error naming the file when it is missing, not a regular
// file, larger than `max_bytes` or unreadable. `what` names the input in messages ("prompt file").
std::string read_regular_file(const std::filesystem::path& path, const char* what = "file",
                              std::uintmax_t max_bytes = kMaxTextFileBytes);

// "line L, column C" of byte offset `offset` in `text` (1-based), for parse error messages.
std::string line_column(const std::string& text, std::size_t offset);

// A library message without its leading "[tag] " (nlohmann's "[json.exception.parse_error.101]
// parse error at line 1, column 2: ..." becomes "parse error at line 1, column 2: ...").
std::string without_tag(const std::string& what);

}  // namespace kvarn

#endif  // KVARN_DATA_READ_FILE_HPP_
