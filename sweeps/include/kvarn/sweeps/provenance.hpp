// Provenance of a sweep run: where the binary came from (git commit and dirty flag at configure
// time and, when `git` is available, at run time), how it was built (build type, compiler,
// library versions), where it ran (CPU, GPU, host) and how it was invoked. Also the SHA-256 used
// for run-directory names, case ids and data fingerprints.
#ifndef KVARN_SWEEPS_PROVENANCE_HPP_
#define KVARN_SWEEPS_PROVENANCE_HPP_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "kvarn/data/atomic_file.hpp"  // utc_timestamp

namespace kvarn {

// The harness version written into every output's provenance.
inline constexpr const char* kKvarnEvalVersion = "0.1.0";

// SHA-256 (FIPS 180-4) of `data`, as 64 lowercase hex digits.
std::string sha256_hex(const std::string& data);

// Content fingerprint of a data file: "sha256:<hex>" of the whole file when it is at most
// kFingerprintFullBytes, else of its size, first and last kFingerprintEdgeBytes (cheap on
// multi-GB captures; documented in docs/results.md). Throws kvarn::Error when unreadable.
inline constexpr std::uintmax_t kFingerprintFullBytes = 256ull << 20;
inline constexpr std::uintmax_t kFingerprintEdgeBytes = 8ull << 20;
std::string file_fingerprint(const std::filesystem::path& path);
// SHA-256 of a whole file (streamed, any size), 64 lowercase hex digits. Throws when unreadable.
std::string sha256_file_hex(const std::filesystem::path& path);


// Everything about the build and the machine; `extra` (seed, command line, ...) is merged in.
nlohmann::json collect_provenance(const nlohmann::json& extra);

// Quotes a shell word when needed (for the reproduce commands and the report launcher).
std::string shell_quote(const std::string& s);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_PROVENANCE_HPP_
