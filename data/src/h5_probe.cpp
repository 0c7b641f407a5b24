#include "kvarn/data/h5_probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "kvarn/data/error.hpp"

// In sanitizer builds libFuzzer registers a death callback that saves the current input as a
// crash; a probe child that dies must not do that (its death is the expected, handled outcome).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace kvarn::h5 {

namespace {

constexpr std::size_t kMaxReport = 64 * 1024;
// The wall-clock backstop of a ProbeWorker's CPU-time limit, in seconds.
constexpr double kMinWallSeconds = 10.0;

std::string& report_buffer() {
  static std::string report;
  return report;
}

void become_probe_child(int err_fd);

bool send_all(int fd, const void* buf, std::size_t n);

// Runs `walk` and hands its result to the parent, whether the walk returned or threw.
[[noreturn]] void child_main(int err_fd, int result_fd, const ProbeWalk& walk, double seconds) {
  become_probe_child(err_fd);
  limit_probe_cpu(seconds);
  std::string result;
  try {
    walk(result);
  } catch (...) {
    // Errors are the parent's to report: it repeats the walk and gets the same one.
  }
  ::_exit(send_all(result_fd, result.data(), result.size()) ? 0 : 1);
}

// Reads the child's stderr (`err_fd`, kept up to kMaxReport) and its result (`result_fd`) until
// both close or `deadline`; false when the deadline passed. Both at once: a child blocked on a
// full pipe would never close the other.
bool drain_until(int err_fd, int result_fd, std::chrono::steady_clock::time_point deadline,
                 std::string& err, std::string& result) {
  char buf[4096];
  pollfd p[2] = {{err_fd, POLLIN, 0}, {result_fd, POLLIN, 0}};
  std::string* out[2] = {&err, &result};
  while (p[0].fd >= 0 || p[1].fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int r = ::poll(p, 2, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r <= 0) continue;  // EINTR or no data yet
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || p[i].revents == 0) continue;
      const ssize_t n = ::read(p[i].fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        p[i].fd = -1;  // EOF: the child exited (or closed it)
      } else if (i == 1 || out[i]->size() < kMaxReport) {
        out[i]->append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  return true;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Identity of a file's current content as far as stat() tells; empty when it cannot be stat'ed.
std::string file_identity(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return {};
  std::ostringstream os;
  os << file << '\n'
     << st.st_dev << ':' << st.st_ino << ':' << st.st_size << ':' << st.st_mtim.tv_sec << '.'
     << st.st_mtim.tv_nsec;
  return os.str();
}

// Throws the error for a probe child that did not finish within `limit` (`finished` false) or
// ended with `status`; keeps its standard error `err` for last_probe_report().
[[noreturn]] void report_failure(const std::string& file, const std::string& what,
                                 const std::string& limit, bool finished, int status,
                                 const std::string& err) {
  report_buffer() = err;
  if (!finished) {
    fail(file, ": libhdf5 did not finish reading ", what, " within ", limit,
         " (stopped; a loop in corrupt metadata?): the file is corrupt");
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    fail(file, ": libhdf5 crashed (signal ", sig, ", ", ::strsignal(sig), ") while reading ", what,
         ": the file is corrupt");
  }
  fail(file, ": libhdf5 failed (the reading process exited with status ", WEXITSTATUS(status),
       ") while reading ", what, ": the file is corrupt");
}

// The child side of a probe: stderr to `err_fd`, no core dumps, no libFuzzer crash report.
void become_probe_child(int err_fd) {
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(nullptr);
  ::dup2(err_fd, STDERR_FILENO);
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
}

bool read_all(int fd, void* buf, std::size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool send_all(int fd, const void* buf, std::size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Appends what `fd` (non-blocking) holds now, up to the report limit.
void drain_available(int fd, std::string& out) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    if (out.size() < kMaxReport) out.append(buf, static_cast<std::size_t>(n));
  }
}

// CPU time `pid` has used, in seconds; -1 when it cannot be read (the process is gone).
double cpu_seconds_of(pid_t pid) {
  clockid_t clock;
  timespec ts{};
  if (::clock_getcpuclockid(pid, &clock) != 0 || ::clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

void limit_probe_cpu(double seconds) {
  // The parent stops a walk at its limit; a parent that died (killed, crashed) cannot, and a
  // libhdf5 loop would spin on. The kernel ends this process (SIGXCPU; no core) when its CPU
  // time passes what it has used so far plus the limit and a margin: after the parent's own stop
  // while the parent lives. Only the soft limit moves (raising a hard limit needs privileges).
  const double used = std::max(cpu_seconds_of(::getpid()), 0.0);
  rlimit r{};
  ::getrlimit(RLIMIT_CPU, &r);
  const rlim_t soft = static_cast<rlim_t>(std::ceil(used + std::max(seconds, 0.0))) + 2;
  r.rlim_cur = r.rlim_max == RLIM_INFINITY ? soft : std::min<rlim_t>(soft, r.rlim_max);
  ::setrlimit(RLIMIT_CPU, &r);
}

double probe_seconds() {
  if (const char* env = std::getenv("KVARN_H5_PROBE_SECONDS")) {
    char* end = nullptr;
    const double s = std::strtod(env, &end);
    if (end != env && *end == '\0' && std::isfinite(s) && s > 0) return s;
  }
  return 60.0;
}

const std::string& last_probe_report() { return report_buffer(); }

std::string run_probe(const std::string& file, const std::string& what, const ProbeWalk& walk,
                      double seconds) {
  int err_fds[2], result_fds[2];
  KVARN_CHECK(::pipe(err_fds) == 0, file, ": cannot start the probe of ", what,
              ": pipe: ", std::strerror(errno));
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, result_fds) != 0) {
    const int e = errno;
    ::close(err_fds[0]);
    ::close(err_fds[1]);
    fail(file, ": cannot start the probe of ", what, ": socketpair: ", std::strerror(e));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(err_fds[0]);
    ::close(result_fds[0]);
    child_main(err_fds[1], result_fds[1], walk, seconds);
  }
  const int fork_errno = errno;
  ::close(err_fds[1]);
  ::close(result_fds[1]);
  if (pid < 0) {
    ::close(err_fds[0]);
    ::close(result_fds[0]);
    fail(file, ": cannot start the probe of ", what, ": fork: ", std::strerror(fork_errno));
  }
  std::string err, result;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<long long>(seconds * 1e6));
  const bool finished = drain_until(err_fds[0], result_fds[0], deadline, err, result);
  if (!finished) ::kill(pid, SIGKILL);
  ::close(err_fds[0]);
  ::close(result_fds[0]);
  const int status = wait_child(pid);
  if (finished && WIFEXITED(status) && WEXITSTATUS(status) == 0) return result;
  report_failure(file, what, seconds_text(seconds) + " s", finished, status, err);
}

std::string probe_file_once(const std::string& file, const std::string& what,
                            const ProbeWalk& walk) {
  static std::mutex mu;
  static std::map<std::string, std::string> passed;  // file identity -> the probe's result
  const std::string id = file_identity(file);
  {
    const std::lock_guard<std::mutex> lock(mu);
    const auto it = id.empty() ? passed.end() : passed.find(id);
    if (it != passed.end()) return it->second;
  }
  std::string result = run_probe(file, what, walk, probe_seconds());
  const std::lock_guard<std::mutex> lock(mu);
  if (!id.empty()) passed.emplace(id, result);
  return result;
}

ProbeWorker::ProbeWorker(Walk walk) : walk_(std::move(walk)) {}

ProbeWorker::~ProbeWorker() { stop(); }

void ProbeWorker::stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait_child(pid_);
  }
  for (int* fd : {&to_child_, &err_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  pid_ = -1;
}

void ProbeWorker::start(const std::string& file, const std::string& what) {
  int sv[2], ep[2];
  KVARN_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, file,
              ": cannot start the probe of ", what, ": socketpair: ", std::strerror(errno));
  if (::pipe2(ep, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    fail(file, ": cannot start the probe of ", what, ": pipe: ", std::strerror(e));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    ::close(ep[0]);
    become_probe_child(ep[1]);
    // One input per request: the time limit, its size, then its bytes; back once walked: one
    // byte, the size of the result, the result.
    double seconds = 0;
    for (std::uint64_t n = 0;
         read_all(sv[1], &seconds, sizeof(seconds)) && read_all(sv[1], &n, sizeof(n));) {
      std::string bytes(n, '\0');
      if (!read_all(sv[1], bytes.data(), n)) break;
      limit_probe_cpu(seconds);
      std::string result;
      try {
        walk_(bytes, result);
      } catch (...) {
        // As in run_probe: the parent repeats the walk and reports its error.
      }
      const char done = 'k';
      const std::uint64_t m = result.size();
      if (!send_all(sv[1], &done, 1) || !send_all(sv[1], &m, sizeof(m)) ||
          !send_all(sv[1], result.data(), m)) {
        break;
      }
    }
    ::_exit(0);
  }
  const int fork_errno = errno;
  ::close(sv[1]);
  ::close(ep[1]);
  if (pid < 0) {
    ::close(sv[0]);
    ::close(ep[0]);
    fail(file, ": cannot start the probe of ", what, ": fork: ", std::strerror(fork_errno));
  }
  ::fcntl(ep[0], F_SETFL, ::fcntl(ep[0], F_GETFL) | O_NONBLOCK);
  pid_ = pid;
  to_child_ = sv[0];
  err_ = ep[0];
}

std::string ProbeWorker::run(const std::string& file, const std::string& what, const void* data,
                             std::size_t size, double seconds) {
  if (pid_ < 0) start(file, what);
  const double cpu_start = cpu_seconds_of(pid_);
  const std::uint64_t n = size;
  const bool sent = send_all(to_child_, &seconds, sizeof(seconds)) &&
                    send_all(to_child_, &n, sizeof(n)) && send_all(to_child_, data, size);
  // The limit is on the child's CPU time for this input: a loop in libhdf5 burns CPU, a child
  // waiting for a busy machine does not. A wall-clock limit backs it (a child stuck without
  // using CPU), at least kMinWallSeconds.
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::microseconds(static_cast<long long>(std::max(seconds, kMinWallSeconds) * 1e6));
  const int poll_ms = std::clamp(static_cast<int>(seconds * 1000 / 4), 1, 1000);
  char reply = 0;
  bool finished = sent;
  bool answered = false;
  std::string limit;
  while (finished && !answered) {
    const double cpu = cpu_seconds_of(pid_);
    if (cpu_start >= 0 && cpu >= 0 && cpu - cpu_start > seconds) {
      limit = seconds_text(seconds) + " s of CPU time";
    } else if (std::chrono::steady_clock::now() >= deadline) {
      limit = seconds_text(std::max(seconds, kMinWallSeconds)) + " s";
    }
    if (!limit.empty()) {
      finished = false;
      break;
    }
    pollfd p{to_child_, POLLIN, 0};
    const int r = ::poll(&p, 1, poll_ms);
    if (r <= 0) continue;
    const ssize_t got = ::read(to_child_, &reply, 1);
    if (got < 0 && errno == EINTR) continue;
    answered = got == 1;
    if (got == 0 || (got < 0 && errno != EAGAIN)) break;  // the child is gone
  }
  std::string err, result;
  if (answered) {
    // The walk is over; the child only sends its result now (a child gone meanwhile: below).
    std::uint64_t m = 0;
    answered = read_all(to_child_, &m, sizeof(m));
    if (answered) {
      result.resize(m);
      answered = read_all(to_child_, result.data(), m);
    }
  }
  if (answered) {
    drain_available(err_, err);  // keep the pipe from filling; nothing to report
    return result;
  }
  if (!finished && sent) ::kill(pid_, SIGKILL);
  const int status = wait_child(pid_);
  // The report of a crash: what the child wrote before it ended (give a symbolizer a moment).
  for (int i = 0; i < 20; ++i) {
    pollfd p{err_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) break;
    const std::size_t before = err.size();
    drain_available(err_, err);
    if (err.size() == before) break;  // EOF
  }
  ::close(to_child_);
  ::close(err_);
  to_child_ = err_ = -1;
  pid_ = -1;
  report_failure(file, what, limit, finished || !sent, status, err);
}

}  // namespace kvarn::h5
