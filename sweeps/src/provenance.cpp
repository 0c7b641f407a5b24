// SHA-256, file fingerprints and the provenance record of a sweep run.
#include "kvarn/sweeps/provenance.hpp"

#include <H5public.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

#include "kvarn/data/error.hpp"
#include "kvarn/eval/gemm.hpp"

#ifndef KVARN_GIT_COMMIT_CONFIGURE
#define KVARN_GIT_COMMIT_CONFIGURE "unknown"
#endif
#ifndef KVARN_GIT_DIRTY_CONFIGURE
#define KVARN_GIT_DIRTY_CONFIGURE -1
#endif
#ifndef KVARN_BUILD_TYPE
#define KVARN_BUILD_TYPE "unknown"
#endif
#ifndef KVARN_YAML_CPP_VERSION
#define KVARN_YAML_CPP_VERSION "unknown"
#endif
#ifndef KVARN_SOURCE_ROOT
#define KVARN_SOURCE_ROOT ""
#endif

namespace kvarn {

namespace {

namespace fs = std::filesystem;

constexpr std::array<std::uint32_t, 64> kSha256K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// The byte loop of the hash is left out of libFuzzer's coverage instrumentation (clang's
// -fsanitize-coverage; AddressSanitizer still checks it): the same fixed-trip loop for every input,
// it gives the fuzzer no signal, and instrumented it took most of the config fuzz targets' time
// per input (each config's tile file is hashed).
#if defined(__clang__) && __clang_major__ >= 13
#define KVARN_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define KVARN_NO_COVERAGE
#endif

// Streaming SHA-256 (small and dependency-free; checked against FIPS test vectors in tests).
class Sha256 {
 public:
  KVARN_NO_COVERAGE void update(const unsigned char* p, std::size_t n) {
    bits_ += static_cast<std::uint64_t>(n) * 8;
    while (n > 0) {
      const std::size_t take = std::min(n, block_.size() - fill_);
      std::memcpy(block_.data() + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == block_.size()) {
        compress();
        fill_ = 0;
      }
    }
  }
  void update(const std::string& s) {
    update(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  }
  std::string hex() {
    const std::uint64_t bits = bits_;
    const unsigned char pad = 0x80, zero = 0;
    update(&pad, 1);
    while (fill_ != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(len, 8);
    std::string out;
    char buf[9];
    for (std::uint32_t w : h_) {
      std::snprintf(buf, sizeof(buf), "%08x", w);
      out += buf;
    }
    return out;
  }

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  KVARN_NO_COVERAGE void compress() {
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (std::uint32_t{block_[4 * i]} << 24) | (std::uint32_t{block_[4 * i + 1]} << 16) |
             (std::uint32_t{block_[4 * i + 2]} << 8) | std::uint32_t{block_[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
                  h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const std::uint32_t ch = (e & f) ^ (~e & g);
      const std::uint32_t t1 = h + s1 + ch + kSha256K[i] + w[i];
      const std::uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const std::uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const std::uint32_t t2 = s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<std::uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> block_{};
  std::size_t fill_ = 0;
  std::uint64_t bits_ = 0;
};

void hash_range(Sha256& sha, std::ifstream& in, std::uintmax_t offset, std::uintmax_t n) {
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<char> buf(static_cast<std::size_t>(std::min<std::uintmax_t>(n, 1 << 16)));
  while (n > 0 && in) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uintmax_t>(n, buf.size()));
    in.read(buf.data(), static_cast<std::streamsize>(want));
    const std::size_t got = static_cast<std::size_t>(in.gcount());
    sha.update(reinterpret_cast<const unsigned char*>(buf.data()), got);
    n -= got;
    if (got < want) break;
  }
}

// Output of a shell command (first line, trimmed), or "" when it fails; stderr is discarded.
std::string run_capture(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  const int rc = ::pclose(p);
  if (rc != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) {
    out.pop_back();
  }
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,+@") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string sha256_hex(const std::string& data) {
  Sha256 sha;
  sha.update(data);
  return sha.hex();
}

namespace {
// Opens `path` for hashing; its size in *size.
std::ifstream open_for_hash(const fs::path& path, std::uintmax_t* size) {
  std::error_code ec;
  *size = fs::file_size(path, ec);
  KVARN_CHECK(!ec, path.string(), ": cannot read: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  KVARN_CHECK(in.good(), path.string(), ": cannot open for reading");
  return in;
}
}  // namespace

std::string file_fingerprint(const fs::path& path) {
  std::uintmax_t size = 0;
  std::ifstream in = open_for_hash(path, &size);
  Sha256 sha;
  if (size <= kFingerprintFullBytes) {
    hash_range(sha, in, 0, size);
    return "sha256:" + sha.hex();
  }
  sha.update("size=" + std::to_string(size) + ";");
  hash_range(sha, in, 0, kFingerprintEdgeBytes);
  hash_range(sha, in, size - kFingerprintEdgeBytes, kFingerprintEdgeBytes);
  return "sha256-edges:" + sha.hex();
}

std::string sha256_file_hex(const fs::path& path) {
  std::uintmax_t size = 0;
  std::ifstream in = open_for_hash(path, &size);
  Sha256 sha;
  hash_range(sha, in, 0, size);
  return sha.hex();
}

nlohmann::json collect_provenance(const nlohmann::json& extra) {
  nlohmann::json j;
  const int dirty_cfg = KVARN_GIT_DIRTY_CONFIGURE;
  nlohmann::json git = {
      {"configure_time",
       {{"commit", KVARN_GIT_COMMIT_CONFIGURE},
        {"dirty", dirty_cfg < 0 ? nlohmann::json(nullptr) : nlohmann::json(dirty_cfg != 0)}}}};
  // Runtime view: the source tree may have moved on since the build was configured.
  const std::string root = KVARN_SOURCE_ROOT;
  if (!root.empty()) {
    const std::string commit = run_capture("git -C " + quote(root) + " rev-parse HEAD");
    if (!commit.empty()) {
      // Count lines: porcelain lines may start with a space, so their text is not a usable flag.
      const std::string changed =
          run_capture("git -C " + quote(root) + " status --porcelain --untracked-files=no | wc -l");
      git["run_time"] = {
          {"commit", commit},
          {"dirty", changed.empty() ? nlohmann::json(nullptr) : nlohmann::json(changed != "0")}};
    }
  }
  j["git"] = git;
  // Flat fields of the run-directory contract (docs/results.md): the run-time view when known.
  const nlohmann::json& view = git.contains("run_time") ? git["run_time"] : git["configure_time"];
  j["git_commit"] = view["commit"];
  j["git_dirty"] = view["dirty"];
  j["build_type"] = KVARN_BUILD_TYPE;
#if defined(__clang__)
  j["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  j["compiler"] = std::string("gcc ") + __VERSION__;
#else
  j["compiler"] = "unknown";
#endif
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
  nlohmann::json libs = {
      {"eigen", std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) +
                    "." + std::to_string(EIGEN_MINOR_VERSION)},
      {"hdf5", std::to_string(h5_major) + "." + std::to_string(h5_minor) + "." +
                   std::to_string(h5_release)},
      {"yaml_cpp", KVARN_YAML_CPP_VERSION},
      {"cli11", CLI11_VERSION},
      {"nlohmann_json", std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
                            std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." +
                            std::to_string(NLOHMANN_JSON_VERSION_PATCH)}};
#ifdef KVARN_CUDA_VERSION
  libs["cuda"] = KVARN_CUDA_VERSION;
#else
  libs["cuda"] = nullptr;  // not built with CUDA
#endif
  j["libraries"] = libs;
  j["cpu"] = cpu_model();
  // The CPU attention metrics' products: their values differ at rounding level between builds.
  j["attention_gemm"] = gemm::uses_avx2() ? "avx2+fma" : "baseline";
  const std::string gpu =
      run_capture("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader");
  if (gpu.empty()) {
    j["gpu"] = nullptr;
  } else {
    const auto comma = gpu.find(',');
    j["gpu"] = {{"name", gpu.substr(0, comma)},
                {"driver", comma == std::string::npos ? "" : gpu.substr(comma + 2)}};
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  j["hostname"] = host;
  j["date"] = utc_timestamp();
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  if (j.contains("seeds") && j["seeds"].contains("config_seed"))
    j["seed"] = j["seeds"]["config_seed"];
  return j;
}

}  // namespace kvarn
