// Kill safety: SIGKILL the real CLI at random moments, resume to completion, and require the
// summaries to equal an uninterrupted run byte for byte, with no temporary or corrupt file left.
#include <H5Cpp.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "sweep_test_util.hpp"

#ifndef KVARN_EVAL_BIN
#error "tests/CMakeLists.txt must define KVARN_EVAL_BIN (path of the kvarn-eval binary)"
#endif

namespace kvarn {
namespace {

using testing_util::slurp_file;
using testing_util::TempDirTest;
namespace fs = std::filesystem;

class KillResumeTest : public TempDirTest {
 protected:
  // Starts `kvarn-eval sweep CONFIG --set output=OUT --no-report`, output discarded.
  pid_t spawn(const fs::path& config, const fs::path& out) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string set = "output=" + out.string();
      ::execl(KVARN_EVAL_BIN, "kvarn-eval", "sweep", config.c_str(), "--set", set.c_str(),
              "--no-report", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }
  int wait_for(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
};

TEST_F(KillResumeTest, KilledRunsResumeToTheSameSummary) {
  const fs::path cfg = small_config(
      "  - fp16\n  - fp8_e4m3\n  - kivi_2bit\n  - turboquant_3bit_nc\n  - kvarn_k4v2_g128\n", "",
      "kill");
  ASSERT_EQ(wait_for(spawn(cfg, dir_ / "clean")), 0);
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay_ms(20, 900);
  int killed_while_running = 0;
  for (int round = 0; round < 6; ++round) {
    const pid_t pid = spawn(cfg, dir_ / "killed");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    if (::kill(pid, SIGKILL) == 0) ++killed_while_running;
    wait_for(pid);
  }
  EXPECT_GT(killed_while_running, 0);
  ASSERT_EQ(wait_for(spawn(cfg, dir_ / "killed")), 0);

  fs::path clean, killed;
  for (const auto& e : fs::directory_iterator(dir_ / "clean")) clean = e.path();
  for (const auto& e : fs::directory_iterator(dir_ / "killed")) killed = e.path();
  ASSERT_EQ(clean.filename(), killed.filename());
  EXPECT_EQ(slurp_file(killed / "summary.jsonl"), slurp_file(clean / "summary.jsonl"));
  EXPECT_EQ(slurp_file(killed / "summary.csv"), slurp_file(clean / "summary.csv"));
  for (const auto& e : fs::recursive_directory_iterator(killed)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << e.path();
    if (e.path().extension() == ".json") {
      EXPECT_FALSE(nlohmann::json::parse(slurp_file(e.path()), nullptr, false).is_discarded())
          << e.path();
    }
    if (e.path().extension() == ".h5") {
      EXPECT_NO_THROW(H5::H5File(e.path().string(), H5F_ACC_RDONLY)) << e.path();
    }
  }
}

}  // namespace
}  // namespace kvarn
