// Writes that never leave a half-written file: write to "<path>.tmp.<pid>" in the same
// directory, fsync, then rename over the destination.
#ifndef KVARN_DATA_ATOMIC_FILE_HPP_
#define KVARN_DATA_ATOMIC_FILE_HPP_

#include <filesystem>
#include <functional>
#include <string>

namespace kvarn {

// Temporary sibling path used while `path` is being written.
std::filesystem::path temp_path_for(const std::filesystem::path& path);

// Calls write(tmp) and renames tmp to path on success; on any exception the temporary is removed
// and the exception propagates. Refuses to overwrite unless `overwrite`.
void write_atomically(const std::filesystem::path& path,
                      const std::function<void(const std::filesystem::path& tmp)>& write,
                      bool overwrite = true);

// Finishes a write into temp_path_for(path): fsync, then rename over `path` (refused when it
// exists and !overwrite). On any failure the temporary is removed and kvarn::Error is thrown.
void commit_temp_file(const std::filesystem::path& tmp, const std::filesystem::path& path,
                      bool overwrite);

// Current UTC time as ISO 8601 ("2026-11-29T12:00:00Z"), for provenance records.
std::string utc_timestamp();

// Whole-file text write, atomically.
void write_text_atomically(const std::filesystem::path& path, const std::string& text,
                           bool overwrite = true);

}  // namespace kvarn

#endif  // KVARN_DATA_ATOMIC_FILE_HPP_
