// Runs the real kvarn-eval binary from tests: fork + exec, an OMP_NUM_THREADS of choice, stdout
// and stderr discarded or captured to files.
#ifndef KVARN_TESTS_SWEEPS_CLI_TEST_UTIL_HPP_
#define KVARN_TESTS_SWEEPS_CLI_TEST_UTIL_HPP_

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#ifndef KVARN_EVAL_BIN
#error "tests/CMakeLists.txt must define KVARN_EVAL_BIN (path of the kvarn-eval binary)"
#endif

namespace kvarn::testing_util {

struct CliOptions {
  int threads = 1;                                   // OMP_NUM_THREADS of the child
  std::string out = "/dev/null", err = "/dev/null";  // where stdout / stderr go
  std::string cwd;                                   // working directory (empty: the test's)
};

// Starts kvarn-eval with `args`; stdin is /dev/null.
inline pid_t spawn_cli(const std::vector<std::string>& args, const CliOptions& o = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(::open("/dev/null", O_RDONLY), 0);
    ::dup2(::open(o.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    ::dup2(::open(o.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    ::setenv("OMP_NUM_THREADS", std::to_string(o.threads).c_str(), 1);
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) ::_exit(126);
    std::vector<char*> argv{const_cast<char*>("kvarn-eval")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(KVARN_EVAL_BIN, argv.data());
    ::_exit(127);
  }
  return pid;
}

// Exit code, or 128 + signal for a killed process.
inline int wait_for(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline int run_cli(const std::vector<std::string>& args, const CliOptions& o = {}) {
  return wait_for(spawn_cli(args, o));
}

}  // namespace kvarn::testing_util

#endif  // KVARN_TESTS_SWEEPS_CLI_TEST_UTIL_HPP_
