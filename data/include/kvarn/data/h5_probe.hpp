// Isolation of libhdf5 from untrusted files. libhdf5 (1.10.8, Debian 12) crashes or loops on some
// corrupt metadata (docs/fuzzing.md, "What the runs found in libhdf5"); no check on our side can
// stop that once the library walks the file. So a reader first walks an untrusted file's
// structure in a forked child process under a time limit: a child that dies by a signal, exits
// abnormally or runs out of time becomes one kvarn::Error naming the file, and only a file whose
// walk survived is opened in this process.
#ifndef KVARN_DATA_H5_PROBE_HPP_
#define KVARN_DATA_H5_PROBE_HPP_

#include <cstddef>
#include <functional>
#include <string>

namespace kvarn::h5 {

// Time limit of one probe in seconds: KVARN_H5_PROBE_SECONDS when set (> 0), else 60.
double probe_seconds();

// In a probe child, before a walk: the kernel ends the process (SIGXCPU) once it has used
// `seconds` more CPU time plus a margin of 1-3 s, so a walk stuck in libhdf5 ends even when the
// parent that would stop it is gone.
void limit_probe_cpu(double seconds);

// A structure walk run in the probe child. It writes what the parent needs from the file and must
// not read itself into `result` (the values of string attributes: libhdf5 read variable-length
// strings of corrupt files safely in the child and crashed on the same bytes in the parent, whose
// memory differs). The parent gets `result` back as it stood when the walk returned or threw.
using ProbeWalk = std::function<void(std::string& result)>;

// Runs `walk` in a forked child with a limit of `seconds`. Returns the walk's result when the
// child finished (whether `walk` returned or threw: the caller repeats the walk in-process and
// gets the same result). Throws kvarn::Error "<file>: libhdf5 crashed (...) while reading <what>;
// the file is corrupt" or "... did not finish reading <what> within N s ..." otherwise. The
// child's standard error (sanitizer reports, in instrumented builds) is kept for
// last_probe_report().
std::string run_probe(const std::string& file, const std::string& what, const ProbeWalk& walk,
                      double seconds);

// run_probe with probe_seconds(), unless the same file (path, device, inode, size, modification
// time) already passed in this process: then the result of that probe.
std::string probe_file_once(const std::string& file, const std::string& what,
                            const ProbeWalk& walk);

// A long-lived probe child for many in-memory inputs: forked on the first run(), it calls `walk`
// on each input's bytes, sent through a socket, and sends its result back. A child that crashed or
// ran out of time is replaced on the next run() (forked from this process as it is then, so that
// its walk takes the path this process's will). Same contract as run_probe, without a fork (and
// the copy-on-write faults of a fresh child) per input, except that the limit `seconds` is on the
// child's CPU time for the input (a loop in libhdf5 burns CPU; a child waiting for a busy machine
// does not), backed by a wall-clock limit of max(seconds, 10 s).
class ProbeWorker {
 public:
  using Walk = std::function<void(const std::string& bytes, std::string& result)>;
  explicit ProbeWorker(Walk walk);
  ~ProbeWorker();
  ProbeWorker(const ProbeWorker&) = delete;
  ProbeWorker& operator=(const ProbeWorker&) = delete;

  std::string run(const std::string& file, const std::string& what, const void* data,
                  std::size_t size, double seconds);

 private:
  void start(const std::string& file, const std::string& what);
  void stop();
  Walk walk_;
  int pid_ = -1;
  int to_child_ = -1, err_ = -1;
};

// The standard error of the last child that failed (at most 64 KiB), for the fuzz targets: they
// tell a crash inside libhdf5 from one in the project's own code.
const std::string& last_probe_report();

}  // namespace kvarn::h5

#endif  // KVARN_DATA_H5_PROBE_HPP_
