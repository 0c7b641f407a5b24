// The malformed-input corpus (tests/corpus/, written by tests/corpus/make_corpus.py) replayed
// through the real CLI: every case in tests/corpus/cases.jsonl must end with exactly the expected
// exit code and, for errors, one stderr line "kvarn-eval: error: ..." holding the expected
// location text; no file may be left in the scratch directory and no corpus file may change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "cli_test_util.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
namespace fs = std::filesystem;

struct Outcome {
  int code = 0;
  std::string out, err;
};

// Runs kvarn-eval with `args` from the source root, capturing stdout and stderr.
Outcome run_in_source_root(const std::vector<std::string>& args, const fs::path& scratch) {
  testing_util::CliOptions o;
  o.out = (scratch.parent_path() / "stdout").string();
  o.err = (scratch.parent_path() / "stderr").string();
  o.cwd = KVARN_SOURCE_DIR;
  Outcome r;
  r.code = testing_util::run_cli(args, o);
  r.out = slurp_file(o.out);
  r.err = slurp_file(o.err);
  return r;
}

std::string substitute(std::string s, const std::map<std::string, std::string>& vars) {
  for (const auto& [k, v] : vars) {
    for (std::size_t at; (at = s.find(k)) != std::string::npos;) s.replace(at, k.size(), v);
  }
  return s;
}

// Size and content of every file under `dir` (the corpus must never change).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && !e.is_symlink()) out[e.path().string()] = slurp_file(e.path());
  }
  return out;
}

std::vector<json> corpus_cases() {
  const fs::path manifest = fs::path(KVARN_SOURCE_DIR) / "tests" / "corpus" / "cases.jsonl";
  std::vector<json> cases;
  std::stringstream ss(slurp_file(manifest));
  for (std::string line; std::getline(ss, line);) {
    if (line.empty() || line[0] == '#') continue;
    cases.push_back(json::parse(line));
  }
  return cases;
}

class BadInputTest : public testing_util::TempDirTest {};

TEST_F(BadInputTest, EveryCorpusCaseFailsCleanly) {
  // A file that hangs libhdf5 is stopped by the reader's probe after 5 s (default 60).
  ::setenv("KVARN_H5_PROBE_SECONDS", "5", 1);
  const fs::path corpus = fs::path(KVARN_SOURCE_DIR) / "tests" / "corpus";
  const auto before = snapshot(corpus);
  const std::vector<json> cases = corpus_cases();
  ASSERT_GE(cases.size(), 40u);
  const fs::path scratch = dir_ / "scratch";
  const std::map<std::string, std::string> vars = {{"{corpus}", corpus.string()},
                                                   {"{tmp}", scratch.string()}};
  for (const json& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    fs::remove_all(scratch);
    fs::create_directories(scratch);
    const json setup = c.contains("setup") ? c["setup"] : json::object();
    for (const auto& [path, text] : setup.items()) {
      testing_util::write_file(substitute(path, vars), substitute(text.get<std::string>(), vars));
    }
    std::set<std::string> preexisting;
    for (const auto& e : fs::recursive_directory_iterator(scratch)) {
      preexisting.insert(e.path().string());
    }
    std::vector<std::string> args;
    for (const json& a : c.at("args")) args.push_back(substitute(a.get<std::string>(), vars));
    const Outcome r = run_in_source_root(args, scratch);
    const int want = c.value("exit", 2);
    EXPECT_EQ(r.code, want) << r.err;
    std::string expect = substitute(c.value("error", ""), vars);
#if !KVARN_HAVE_RUNNER
    // Without libtorch `capture` is refused before it reads anything: still one clean error.
    if (!args.empty() && args.front() == "capture") {
      expect = "capture: kvarn-eval was built without libtorch";
    }
#endif
    if (!expect.empty()) {
      // One error line, the last one ("kvarn-eval: error: ..."), holding the file and place;
      // lines before it may only be progress ("[capture] loading ...").
      const std::size_t last = r.err.rfind('\n', r.err.size() >= 2 ? r.err.size() - 2 : 0);
      const std::string line = r.err.substr(last == std::string::npos ? 0 : last + 1);
      EXPECT_EQ(line.rfind("kvarn-eval: error: ", 0), 0u) << r.err;
      EXPECT_EQ(r.err.find("kvarn-eval: error: "), r.err.size() - line.size()) << r.err;
      EXPECT_NE(line.find(expect), std::string::npos)
          << "expected: " << expect << "\ngot: " << r.err;
    }
    if (c.contains("stdout")) {
      EXPECT_NE(r.out.find(c.at("stdout").get<std::string>()), std::string::npos) << r.out;
    }
    for (const auto& e : fs::recursive_directory_iterator(scratch)) {
      EXPECT_TRUE(preexisting.count(e.path().string())) << "left behind: " << e.path();
    }
    for (const auto& [path, text] : setup.items()) {
      EXPECT_EQ(slurp_file(substitute(path, vars)), substitute(text.get<std::string>(), vars))
          << "input modified: " << path;
    }
  }
  EXPECT_TRUE(snapshot(corpus) == before) << "a corpus file was modified";
}

}  // namespace
}  // namespace kvarn
