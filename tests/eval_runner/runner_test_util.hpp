// Shared helpers of the runner tests: the transformers reference outputs, generated once per
// version of make_reference.py into a temporary folder (a lock serializes parallel ctest runs).
#ifndef KVARN_TESTS_EVAL_RUNNER_RUNNER_TEST_UTIL_HPP_
#define KVARN_TESTS_EVAL_RUNNER_RUNNER_TEST_UTIL_HPP_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace kvarn::test {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::filesystem::path smollm2_dir() {
  return std::filesystem::path(KVARN_SOURCE_DIR) / "data/cache/smollm2-135m-instruct";
}

inline std::filesystem::path fixture_dir() {
  return std::filesystem::path(KVARN_SOURCE_DIR) / "data/models/fixture-qwen3-h128";
}

// Part of the reference cache key: which of the model's files exist, and the weights' size and
// time, so that new weights regenerate the reference.
inline std::string model_stamp(const std::filesystem::path& dir) {
  std::error_code ec;
  std::string stamp = std::filesystem::exists(dir / "tokenizer.json") ? "tokenizer;" : "";
  const auto w = dir / "model.safetensors";
  if (const auto size = std::filesystem::file_size(w, ec); !ec) {
    stamp += std::to_string(size) + "@" +
             std::to_string(std::filesystem::last_write_time(w, ec).time_since_epoch().count());
  }
  return stamp;
}

// The reference folder, or "" with *why set when python/transformers are unavailable.
inline std::filesystem::path reference_dir(std::string* why) {
  static std::filesystem::path dir;
  static std::string reason;
  static bool done = false;
  if (!done) {
    done = true;
    // A prepared reference folder (e.g. copied to a machine without transformers).
    if (const char* env = std::getenv("KVARN_RUNNER_REF_DIR");
        env != nullptr && std::filesystem::exists(std::filesystem::path(env) / "reference.json")) {
      dir = env;
      if (why != nullptr) why->clear();
      return dir;
    }
    const auto script =
        std::filesystem::path(KVARN_SOURCE_DIR) / "tests/eval_runner/make_reference.py";
    const bool smol = std::filesystem::exists(smollm2_dir() / "tokenizer.json");
    const bool fixture = std::filesystem::exists(fixture_dir() / "tokenizer.json");
    const std::string key = read_text(script) + "smollm2:" + model_stamp(smollm2_dir()) +
                            "fixture:" + model_stamp(fixture_dir());
    const auto out = std::filesystem::temp_directory_path() /
                     ("kvarn_runner_ref_" + std::to_string(std::hash<std::string>{}(key)));
    std::filesystem::create_directories(out);
    const int fd = ::open((out / ".lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (fd >= 0) ::flock(fd, LOCK_EX);
    if (!std::filesystem::exists(out / "reference.json")) {
      if (std::system("python3 -c 'import torch, transformers, tokenizers, safetensors' "
                      ">/dev/null 2>&1") != 0) {
        reason =
            "python3 cannot import torch/transformers/tokenizers/safetensors "
            "(scripts/install_deps.sh installs them)";
      } else {
        std::string cmd = "python3 '" + script.string() + "' '" + out.string() + "'";
        if (smol) cmd += " --smollm2 '" + smollm2_dir().string() + "'";
        if (fixture) cmd += " --fixture '" + fixture_dir().string() + "'";
        cmd += " > '" + (out / "make_reference.log").string() + "' 2>&1";
        if (std::system(cmd.c_str()) != 0) {
          reason = "make_reference.py failed; see " + (out / "make_reference.log").string();
          std::filesystem::remove(out / "reference.json");
        }
      }
    }
    if (fd >= 0) ::close(fd);
    if (reason.empty()) dir = out;
  }
  if (why != nullptr) *why = reason;
  return dir;
}

inline nlohmann::json reference_json(const std::filesystem::path& dir) {
  return nlohmann::json::parse(read_text(dir / "reference.json"));
}

}  // namespace kvarn::test

// Fails (not skips) when the reference cannot be made although torch was found at build time,
// except when transformers is missing, which skips visibly.
#define KVARN_REFERENCE_DIR(var)                                                     \
  std::string var##_why;                                                             \
  const auto var = ::kvarn::test::reference_dir(&var##_why);                         \
  if (var.empty()) {                                                                 \
    if (var##_why.rfind("python3 cannot import", 0) == 0) GTEST_SKIP() << var##_why; \
    FAIL() << var##_why;                                                             \
  }

#endif  // KVARN_TESTS_EVAL_RUNNER_RUNNER_TEST_UTIL_HPP_
