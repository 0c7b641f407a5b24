// The libhdf5 isolation (h5_probe.hpp) and the tile reader on untrusted files: the files that
// crashed (SIGSEGV) and hung libhdf5 1.10.8 end in one kvarn::Error naming the file; the
// in-memory reader agrees with the file reader.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/h5_probe.hpp"
#include "kvarn/data/tile_file.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

const fs::path kCrashes = fs::path(KVARN_SOURCE_DIR) / "fuzz" / "crashes" / "tile_reader";

std::string probe_error(const std::function<void()>& walk, double seconds) {
  try {
    h5::run_probe(
        "some/file.h5", "the file structure", [&](std::string&) { walk(); }, seconds);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(H5Probe, FinishedWalkReturnsWhetherItThrewOrNot) {
  EXPECT_EQ(probe_error([] {}, 10), "");
  EXPECT_EQ(probe_error([] { fail("bad input"); }, 10), "");
}

// What the child's walk wrote comes back whole (more than a pipe holds at once), also when it
// threw after writing.
TEST(H5Probe, ResultOfTheWalkComesBack) {
  const std::string big(3 << 20, 'x');
  EXPECT_EQ(h5::run_probe(
                "f.h5", "it", [&](std::string& r) { r = big; }, 30),
            big);
  EXPECT_EQ(h5::run_probe(
                "f.h5", "it",
                [](std::string& r) {
                  r = "partial";
                  fail("bad input");
                },
                30),
            "partial");
  EXPECT_EQ(h5::run_probe(
                "f.h5", "it", [](std::string&) {}, 30),
            "");
}

TEST(H5Probe, CrashIsOneErrorNamingTheFile) {
  const std::string e = probe_error([] { std::abort(); }, 10);
  EXPECT_EQ(e.rfind("some/file.h5: libhdf5 crashed (signal 6", 0), 0u) << e;
  EXPECT_NE(e.find("while reading the file structure: the file is corrupt"), std::string::npos)
      << e;
  const std::string x = probe_error([] { std::_Exit(3); }, 10);
  EXPECT_EQ(x,
            "some/file.h5: libhdf5 failed (the reading process exited with status 3) while "
            "reading the file structure: the file is corrupt");
}

TEST(H5Probe, HangIsStoppedAtTheLimit) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = probe_error(
      [] {
        for (;;) ::pause();
      },
      0.5);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e,
            "some/file.h5: libhdf5 did not finish reading the file structure within 0.5 s "
            "(stopped; a loop in corrupt metadata?): the file is corrupt");
  EXPECT_LT(s, 5.0);
}

// Files found by fuzz_tile_reader: a corrupt global-heap object that made H5HG_read memcpy a wild
// length (SIGSEGV without sanitizers) and one that made it loop. Before the probe the first
// crashed the process and the second never returned.
TEST(TileReaderUntrusted, Libhdf5CrashIsOneError) {
  const fs::path f = kCrashes / "hdf5_global_heap_memcpy_overlap.h5";
  try {
    TileReader r(f);
    FAIL() << "opened a corrupt file";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(f.string() + ": libhdf5 ", 0), 0u) << msg;
    EXPECT_NE(msg.find("the file is corrupt"), std::string::npos) << msg;
  }
}

TEST(TileReaderUntrusted, Libhdf5HangIsOneError) {
  ::setenv("KVARN_H5_PROBE_SECONDS", "3", 1);
  const fs::path f = kCrashes / "hdf5_global_heap_hang.h5";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    TileReader r(f);
    FAIL() << "opened a corrupt file";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              f.string() +
                  ": libhdf5 did not finish reading the file structure within 3 s "
                  "(stopped; a loop in corrupt metadata?): the file is corrupt");
  }
  ::unsetenv("KVARN_H5_PROBE_SECONDS");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20.0);
}

std::vector<char> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(TileReaderUntrusted, InMemoryImageReadsLikeTheFile) {
  const fs::path f = fs::path(KVARN_SOURCE_DIR) / "data" / "tiles" / "sample.h5";
  const std::vector<char> bytes = bytes_of(f);
  const TileReader disk(f);
  const TileReader mem("sample-in-memory.h5", bytes.data(), bytes.size());
  EXPECT_EQ(mem.path(), fs::path("sample-in-memory.h5"));
  ASSERT_EQ(mem.num_sequences(), disk.num_sequences());
  EXPECT_EQ(mem.info().layers, disk.info().layers);
  EXPECT_EQ(mem.info().head_dim, disk.info().head_dim);
  const int last = disk.num_sequences() - 1;
  EXPECT_EQ(mem.token_ids(last), disk.token_ids(last));
  const TileMatrix a = disk.read(last, "k", disk.info().num_captured_layers() - 1, 0);
  const TileMatrix b = mem.read(last, "k", disk.info().num_captured_layers() - 1, 0);
  EXPECT_GT(a.cwiseAbs().maxCoeff(), 0.0f);
  EXPECT_TRUE(a == b);
}

// libhdf5 read corrupt variable-length string attributes safely in the probe child and then
// crashed on them in this process (fuzz/crashes/tile_reader/*_in_process.h5): the values come
// from the child, and this process never lets libhdf5 read them.
TEST(TileReaderUntrusted, StringAttributesAreReadOnlyByTheProbe) {
  const fs::path f = fs::path(KVARN_SOURCE_DIR) / "tests" / "corpus" / "h5" / "valid.h5";
  const std::vector<char> bytes = bytes_of(f);
  const TileReader disk(f);
  const TileReader mem("valid-in-memory.h5", bytes.data(), bytes.size());
  for (const TileReader* r : {&disk, &mem}) {
    EXPECT_FALSE(r->info().model.empty());
    EXPECT_FALSE(r->info().provenance.empty());
    EXPECT_EQ(r->info().model, disk.info().model);
    EXPECT_EQ(r->info().source, disk.info().source);
    EXPECT_EQ(r->info().provenance, disk.info().provenance);
    ASSERT_EQ(r->num_sequences(), 1);
    EXPECT_FALSE(r->sequence(0).prompt_id.empty());
    EXPECT_EQ(r->sequence(0).prompt_id, disk.sequence(0).prompt_id);
  }
  for (const char* name : {"hdf5_vlen_global_heap_segv_in_process.h5",
                           "hdf5_vlen_conversion_memcpy_overlap_in_process.h5",
                           "hdf5_vlen_memcpy_overlap_in_process_2.h5"}) {
    const std::vector<char> crash = bytes_of(kCrashes / name);
    ASSERT_FALSE(crash.empty()) << name;
    try {
      const TileReader r(name, crash.data(), crash.size());
      r.validate_values();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string(name) + ": ", 0), 0u) << e.what();
    }
  }
  EXPECT_EQ(TileReader::string_attribute_reads_in_process(), 0);
}

// An error reading a string attribute in the child is the same error in this process.
TEST(TileReaderUntrusted, StringAttributeErrorsComeBackFromTheProbe) {
  const fs::path dir =
      fs::temp_directory_path() / ("kvarn-h5-strings-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path valid = fs::path(KVARN_SOURCE_DIR) / "tests" / "corpus" / "h5" / "valid.h5";
  const fs::path int_model = dir / "int_model.h5", no_source = dir / "no_source.h5";
  for (const fs::path& p : {int_model, no_source}) {
    fs::copy_file(valid, p, fs::copy_options::overwrite_existing);
    H5::H5File file(p.string(), H5F_ACC_RDWR);
    if (p == int_model) {
      file.removeAttr("model");
      h5::write_int_attr(file, "model", 7);
    } else {
      file.removeAttr("source");
    }
  }
  const std::pair<fs::path, std::string> cases[] = {
      {int_model, ": /: attribute 'model' must be a string, is 64-bit integer"},
      {no_source, ": /: missing attribute 'source'"}};
  for (const auto& [p, message] : cases) {
    const std::vector<char> bytes = bytes_of(p);
    for (const bool image : {false, true}) {
      try {
        if (image) {
          TileReader r(p, bytes.data(), bytes.size());
        } else {
          TileReader r(p);
        }
        ADD_FAILURE() << "opened " << p;
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), p.string() + message);
      }
    }
  }
  fs::remove_all(dir);
  EXPECT_EQ(TileReader::string_attribute_reads_in_process(), 0);
}

// libhdf5 1.10.8 decodes corrupt attribute messages past the end of their buffer, and what it
// meets there depends on the state of the process's heap: on
// fuzz/crashes/tile_reader/hdf5_attr_decode_overread_in_process*.h5 its probe child (in the
// fuzzer's state at the time) finished the walk, and the same walk in the fuzzer crashed
// (heap-use-after-free under H5Aexists). This process now walks no file: the child sends back
// the structure or the error, and this process only opens the file and reads datasets.
TEST(TileReaderUntrusted, StructureIsWalkedOnlyByTheProbe) {
  const fs::path sample = fs::path(KVARN_SOURCE_DIR) / "data" / "tiles" / "sample.h5";
  const std::vector<char> bytes = bytes_of(sample);
  const TileReader disk(sample);
  const TileReader mem("sample-in-memory.h5", bytes.data(), bytes.size());
  // Every field the walk fills comes back from the child unchanged.
  EXPECT_EQ(mem.info().model, disk.info().model);
  EXPECT_EQ(mem.info().num_layers, disk.info().num_layers);
  EXPECT_EQ(mem.info().num_kv_heads, disk.info().num_kv_heads);
  EXPECT_EQ(mem.info().num_q_heads, disk.info().num_q_heads);
  EXPECT_EQ(mem.info().head_dim, disk.info().head_dim);
  ASSERT_TRUE(disk.info().rope_theta.has_value());
  EXPECT_EQ(*disk.info().rope_theta, 10000.0);
  EXPECT_EQ(mem.info().rope_theta, disk.info().rope_theta);
  EXPECT_EQ(mem.info().source, disk.info().source);
  EXPECT_EQ(mem.info().provenance, disk.info().provenance);
  EXPECT_EQ(mem.info().layers, disk.info().layers);
  ASSERT_EQ(disk.num_sequences(), mem.num_sequences());
  ASSERT_GE(disk.num_sequences(), 2);
  EXPECT_TRUE(disk.sequence(0).has_k_pre_rope);
  EXPECT_FALSE(disk.sequence(1).has_k_pre_rope);
  for (int s = 0; s < disk.num_sequences(); ++s) {
    const SequenceInfo &a = disk.sequence(s), &b = mem.sequence(s);
    EXPECT_EQ(a.name, sequence_name(s));
    EXPECT_EQ(b.name, a.name);
    EXPECT_GT(a.num_tokens, 0);
    EXPECT_EQ(b.num_tokens, a.num_tokens);
    EXPECT_EQ(b.prompt_id, a.prompt_id);
    EXPECT_EQ(b.has_k_pre_rope, a.has_k_pre_rope);
    EXPECT_TRUE(a.has_q);
    EXPECT_EQ(b.has_q, a.has_q);
    EXPECT_FALSE(a.q_heads.empty());
    EXPECT_EQ(b.q_heads, a.q_heads);
  }
  mem.validate_values();
  // The crash inputs, one after another in this process, by path and as images: each opens or
  // ends in one error naming the file, and none is walked here. (A loop is stopped after 1 s.)
  ::setenv("KVARN_H5_PROBE_SECONDS", "1", 1);
  for (const auto& entry : fs::directory_iterator(kCrashes)) {
    const fs::path f = entry.path();
    const std::vector<char> crash = bytes_of(f);
    for (const bool image : {false, true}) {
      try {
        const TileReader r =
            image ? TileReader(f.filename(), crash.data(), crash.size()) : TileReader(f);
        r.validate_values();
      } catch (const Error& e) {
        const std::string name = image ? f.filename().string() : f.string();
        EXPECT_EQ(std::string(e.what()).rfind(name + ": ", 0), 0u) << e.what();
      }
    }
  }
  ::unsetenv("KVARN_H5_PROBE_SECONDS");
  EXPECT_EQ(TileReader::structure_walks_in_process(), 0);
  EXPECT_EQ(TileReader::string_attribute_reads_in_process(), 0);
}

TEST(TileReaderUntrusted, InMemoryImageErrorsNameTheLabel) {
  const std::vector<char> bytes = bytes_of(kCrashes / "hdf5_global_heap_memcpy_overlap.h5");
  try {
    TileReader r("input.h5", bytes.data(), bytes.size());
    FAIL() << "opened a corrupt image";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("input.h5: libhdf5 ", 0), 0u) << e.what();
  }
  // The probe child that crashed is replaced: a valid image opens again.
  const std::vector<char> valid =
      bytes_of(fs::path(KVARN_SOURCE_DIR) / "tests" / "corpus" / "h5" / "valid.h5");
  EXPECT_EQ(TileReader("valid.h5", valid.data(), valid.size()).num_sequences(), 1);
  const std::string text = "not hdf5 at all";
  try {
    TileReader r("text.h5", text.data(), text.size());
    FAIL() << "opened text";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "text.h5: not an HDF5 file (no HDF5 signature at offset 0)");
  }
}

// The long-lived worker of in-memory images: each input's bytes say what the walk does.
h5::ProbeWorker& scripted_worker() {
  static h5::ProbeWorker worker([](const std::string& bytes, std::string& result) {
    result = "walked " + bytes;
    if (bytes == "big") result.append(3 << 20, 'x');
    if (bytes == "abort") std::abort();
    if (bytes == "spin") {
      volatile unsigned long sink = 0;
      for (;;) sink = sink + 1;
    }
    if (bytes == "sleep") ::usleep(600 * 1000);
  });
  return worker;
}

std::string worker_error(const std::string& input, double seconds) {
  try {
    const std::string result = scripted_worker().run("image.h5", "the file structure", input.data(),
                                                     input.size(), seconds);
    EXPECT_EQ(result.substr(0, 7 + input.size()), "walked " + input);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ProbeWorker, ResultOfEachWalkComesBack) {
  for (const std::string input : {"big", "ok", "big"}) {
    const std::string r = scripted_worker().run("image.h5", "it", input.data(), input.size(), 30);
    EXPECT_EQ(r.size(), 7 + input.size() + (input == "big" ? (3u << 20) : 0u));
    EXPECT_EQ(r.substr(0, 10), "walked " + input.substr(0, 3));
  }
}

TEST(ProbeWorker, CrashedWorkerIsReplacedEveryTime) {
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(worker_error("ok", 10), "");
    const std::string e = worker_error("abort", 10);
    EXPECT_EQ(e.rfind("image.h5: libhdf5 crashed (signal 6", 0), 0u) << e;
  }
  EXPECT_EQ(worker_error("ok", 10), "");
}

// The limit is on the worker's CPU time: a loop is stopped at it, a worker that waits longer
// than the limit without using CPU (a busy machine) is not.
TEST(ProbeWorker, LimitIsOnCpuTime) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(worker_error("spin", 0.2),
            "image.h5: libhdf5 did not finish reading the file structure within 0.2 s of CPU "
            "time (stopped; a loop in corrupt metadata?): the file is corrupt");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 9.0);  // not the wall-clock backstop
  EXPECT_EQ(worker_error("sleep", 0.2), "");
  EXPECT_EQ(worker_error("ok", 0.2), "");
}

// Whether process `pid` has ended (gone, or a zombie not yet reaped by its new parent).
bool ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  return text.empty() || (close != std::string::npos && close + 2 < text.size() &&
                          (text[close + 2] == 'Z' || text[close + 2] == 'X'));
}

// Waits up to `seconds` of wall time for `pid` to end; kills it when it does not.
bool ends_within(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (ended(pid)) return true;
    ::usleep(50 * 1000);
  }
  ::kill(pid, SIGKILL);
  return false;
}

[[noreturn]] void spin_forever() {
  volatile std::uint64_t i = 0;
  for (;;) {
    const std::uint64_t next = i + 1;
    i = next;
  }
}

// The kernel's CPU limit of a probe child: a loop that nobody stops ends by SIGXCPU.
TEST(H5Probe, CpuLimitEndsALoopByItself) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    h5::limit_probe_cpu(0.2);
    spin_forever();
  }
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the loop ran 60 s of wall time past a CPU limit of 0.2 s + margin";
    }
    ::usleep(20 * 1000);
  }
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGXCPU);
}

// A ProbeWorker whose parent dies mid-walk (killed while waiting for a looping walk) does not
// spin on: the kernel ends it a few CPU seconds after the walk's limit.
TEST(ProbeWorker, OrphanedWorkerEndsByItself) {
  int pids[2];
  ASSERT_EQ(::pipe(pids), 0);
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ::close(pids[0]);
    ::alarm(1);  // this process dies (SIGALRM) long before the walk's 1.5 s of CPU
    h5::ProbeWorker w([fd = pids[1]](const std::string&, std::string&) {
      const pid_t me = ::getpid();
      if (::write(fd, &me, sizeof(me)) != sizeof(me)) ::_exit(3);
      spin_forever();
    });
    const char input = 'x';
    try {
      w.run("image.h5", "it", &input, 1, 1.5);
    } catch (...) {
    }
    ::_exit(2);  // not reached unless the walk ended first
  }
  ::close(pids[1]);
  pid_t walker = -1;
  const bool got = ::read(pids[0], &walker, sizeof(walker)) == sizeof(walker);
  ::close(pids[0]);
  int status = 0;
  ::waitpid(parent, &status, 0);
  ASSERT_TRUE(got);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) << status;
  // 1.5 s of CPU plus the margin (at most 3.5 s of CPU), with room for a loaded machine.
  EXPECT_TRUE(ends_within(walker, 60)) << "the orphaned probe child " << walker << " kept running";
}

}  // namespace
}  // namespace kvarn
