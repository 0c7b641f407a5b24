#include "kvarn/sweeps/quantize.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "kvarn/core/registry.hpp"
#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/quantized_file.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/provenance.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds the calling thread has used: unlike wall time, this does not grow when the
// machine is shared.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Wall and CPU seconds of one step, added to a phase's totals.
class StepTimer {
 public:
  void add_to(double* wall, double* cpu) const {
    *wall += seconds_since(wall0_);
    *cpu += thread_cpu_seconds() - cpu0_;
  }

 private:
  Clock::time_point wall0_ = Clock::now();
  double cpu0_ = thread_cpu_seconds();
};

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// Resolves --layers (model layer indices, as in the file's `layers` dataset) to
// captured indices.
std::vector<int> select_layers(const TileReader& r, const std::vector<int>& wanted) {
  const std::vector<int>& captured = r.info().layers;
  std::vector<int> out;
  if (wanted.empty()) {
    for (int i = 0; i < r.info().num_captured_layers(); ++i) out.push_back(i);
    return out;
  }
  for (int l : wanted) {
    auto it = std::find(captured.begin(), captured.end(), l);
    KVARN_CHECK(it != captured.end(), r.path().string(), ": --layers: model layer ", l,
                " is not captured in this file (captured: ", join(captured), ")");
    out.push_back(static_cast<int>(it - captured.begin()));
  }
  return out;
}

std::vector<int> select_range(const std::vector<int>& wanted, int n, const std::string& what,
                              const std::string& file) {
  std::vector<int> out;
  if (wanted.empty()) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int x : wanted) {
    KVARN_CHECK(x >= 0 && x < n, file, ": --", what, ": index ", x, " out of range (the file has ",
                n, " ", what, ")");
    out.push_back(x);
  }
  return out;
}

// The NMSE sums of both streams: sum (hat - ref)^2 and sum ref^2 in double, each in index order:
// the same sums, bit for bit, as Eigen's squaredNorm of the cast expressions (a sequential,
// unvectorized reduction). Each sum is a chain of dependent additions, so the squares are computed
// first, a block at a time in a loop that vectorizes, and the four chains (K and V, error and
// reference) then add them in one loop, where they overlap instead of waiting on each other.
struct NmseSums {
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0;
};

constexpr std::size_t kNmseBlock = 256;

// err[i] = (hat[i] - ref[i])^2 and sq[i] = ref[i]^2 in double, for i < n.
__attribute__((target_clones("avx2", "default"))) void squares(const float* hat, const float* ref,
                                                               std::size_t n, double* err,
                                                               double* sq) {
  for (std::size_t i = 0; i < n; ++i) {
    const double x = ref[i];
    const double d = static_cast<double>(hat[i]) - x;
    err[i] = d * d;
    sq[i] = x * x;
  }
}

// Adds one stream's squares, in index order, to its two sums.
void add_squares(const float* hat, const float* ref, std::size_t n, double* err_sum,
                 double* ref_sum) {
  double err[kNmseBlock], sq[kNmseBlock];
  for (std::size_t i0 = 0; i0 < n; i0 += kNmseBlock) {
    const std::size_t m = std::min(kNmseBlock, n - i0);
    squares(hat + i0, ref + i0, m, err, sq);
    for (std::size_t i = 0; i < m; ++i) {
      *err_sum += err[i];
      *ref_sum += sq[i];
    }
  }
}

NmseSums nmse_sums(const MatrixMap& k_hat, const Matrix& k, const MatrixMap& v_hat,
                   const Matrix& v) {
  KVARN_CHECK(k_hat.size() == k.size() && v_hat.size() == v.size(),
              "reconstruction and input differ in size");
  const std::size_t nk = static_cast<std::size_t>(k.size());
  const std::size_t nv = static_cast<std::size_t>(v.size());
  const std::size_t both = std::min(nk, nv);
  NmseSums s;
  double ke[kNmseBlock], kr[kNmseBlock], ve[kNmseBlock], vr[kNmseBlock];
  for (std::size_t i0 = 0; i0 < both; i0 += kNmseBlock) {
    const std::size_t m = std::min(kNmseBlock, both - i0);
    squares(k_hat.data() + i0, k.data() + i0, m, ke, kr);
    squares(v_hat.data() + i0, v.data() + i0, m, ve, vr);
    for (std::size_t i = 0; i < m; ++i) {
      s.k_err += ke[i];
      s.k_ref += kr[i];
      s.v_err += ve[i];
      s.v_ref += vr[i];
    }
  }
  add_squares(k_hat.data() + both, k.data() + both, nk - both, &s.k_err, &s.k_ref);
  add_squares(v_hat.data() + both, v.data() + both, nv - both, &s.v_err, &s.v_ref);
  return s;
}

// One stream's chunks as the file stores them: per field name the chunks
// concatenated.
QuantizedStream collect_stream(const std::vector<Chunk>& chunks, const StreamCodec& codec,
                               const std::vector<std::uint8_t>& quantized,
                               const std::string& where) {
  QuantizedStream s;
  const StreamPolicy p = codec.policy();
  s.chunk_tokens = p.chunk;
  s.sink = p.sink;
  s.keep_recent = p.keep_recent;
  s.chunk_bytes = static_cast<long long>(codec.chunk_bytes());
  s.kept_tokens = static_cast<int>(std::count(quantized.begin(), quantized.end(), 0));
  s.kept_token_bytes = static_cast<long long>(codec.kept_token_bytes());
  s.code_bits = codec.code_bits();
  const std::size_t n = chunks.size();
  s.first_token.resize(n);
  for (std::size_t i = 0; i < n; ++i) s.first_token[i] = chunks[i].first_token;
  if (chunks.empty()) return s;
  for (const Field& f0 : chunks.front().fields) {
    QuantizedField out{f0.name, f0.dtype, f0.shape, {}};
    out.bytes.reserve(f0.bytes.size() * n);
    for (std::size_t i = 0; i < n; ++i) {
      const Field* f = chunks[i].find(f0.name);
      KVARN_CHECK(
          f && f->dtype == f0.dtype && f->shape == f0.shape && f->bytes.size() == f0.bytes.size(),
          where, "/", f0.name, ": chunk ", i, " stores this field with a different dtype or shape");
      out.bytes.insert(out.bytes.end(), f->bytes.begin(), f->bytes.end());
    }
    s.fields.push_back(std::move(out));
  }
  return s;
}

struct SlabJob {
  SlabKey key;
  LayerContext ctx;
  std::string where;
  StoredSlab k_in, v_in;  // input as stored, released once decoded
  Matrix k, v;            // input, released once quantized
  QuantizedSlab out;
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0;
  double decode_s = 0, quantize_s = 0, collect_s = 0, metrics_s = 0;
  double compute_cpu_s = 0;  // CPU seconds of the four above
};

// The stored fields, byte checks and masks of the quantized slab, taken out of the cache.
void collect_slab(const Method& method, KvCache* cache, SlabJob* job) {
  const int T = static_cast<int>(job->k.rows()), D = static_cast<int>(job->k.cols());
  auto kc = method.make_codec(StreamKind::kKey, D, job->ctx);
  auto vc = method.make_codec(StreamKind::kValue, D, job->ctx);
  QuantizedSlab& s = job->out;
  s.num_tokens = T;
  s.k_quantized = quantized_flags(*cache, StreamKind::kKey);
  s.v_quantized = quantized_flags(*cache, StreamKind::kValue);
  s.k = collect_stream(cache->release_chunks(StreamKind::kKey), *kc, s.k_quantized,
                       job->where + "/k");
  s.v = collect_stream(cache->release_chunks(StreamKind::kValue), *vc, s.v_quantized,
                       job->where + "/v");
  const std::size_t stored = s.k.payload_bytes() + s.v.payload_bytes() +
                             s.k.kept_tokens * kc->kept_token_bytes() +
                             s.v.kept_tokens * vc->kept_token_bytes();
  const std::size_t accounted = method.sequence_bytes(T, D, job->ctx);
  KVARN_CHECK(stored == cache->stored_bytes(), job->where, ": wrote ", stored,
              " bytes but the cache measured ", cache->stored_bytes());
  KVARN_CHECK(stored == accounted, job->where, ": stored ", stored,
              " bytes but Method::sequence_bytes accounts ", accounted, " (method ", method.spec(),
              ", ", T, " tokens)");
  s.stored_bytes = static_cast<long long>(stored);
  s.accounted_bytes = static_cast<long long>(accounted);
  s.fp16_bytes = 4LL * T * D;
  s.layer_skipped = method.layer_skipped(job->ctx);
}

// Decodes and quantizes one slab into job->out: the method's cache (sequence_cache, the whole
// slab in one append, as quantize_sequence), the stored fields, the byte checks and the NMSE sums
// of both streams. The sums and the reconstructions are read from the cache in place.
void quantize_slab(const Method& method, bool reconstruction, SlabJob* job) {
  const double cpu0 = thread_cpu_seconds();
  auto t0 = Clock::now();
  job->k = decode_slab(job->k_in);
  job->v = decode_slab(job->v_in);
  job->k_in = StoredSlab();
  job->v_in = StoredSlab();
  job->decode_s = seconds_since(t0);
  t0 = Clock::now();
  // decode_slab rejected every non-finite value already.
  const std::unique_ptr<KvCache> cache =
      sequence_cache(method, job->k, job->v, job->ctx, job->where, FiniteRows::kKnown);
  job->quantize_s = seconds_since(t0);
  t0 = Clock::now();
  collect_slab(method, cache.get(), job);
  job->collect_s = seconds_since(t0);
  t0 = Clock::now();
  const MatrixMap k_hat = cache->keys(), v_hat = cache->values();
  const NmseSums sums = nmse_sums(k_hat, job->k, v_hat, job->v);
  job->k_err = sums.k_err;
  job->k_ref = sums.k_ref;
  job->v_err = sums.v_err;
  job->v_ref = sums.v_ref;
  job->out.k_nmse = job->k_ref > 0 ? job->k_err / job->k_ref : 0.0;
  job->out.v_nmse = job->v_ref > 0 ? job->v_err / job->v_ref : 0.0;
  job->metrics_s = seconds_since(t0);
  if (reconstruction) {
    job->out.k_hat.assign(k_hat.data(), k_hat.data() + k_hat.size());
    job->out.v_hat.assign(v_hat.data(), v_hat.data() + v_hat.size());
  }
  job->k.resize(0, 0);
  job->v.resize(0, 0);
  job->compute_cpu_s = thread_cpu_seconds() - cpu0;
}

int worker_threads(const QuantizeFileOptions& o) {
#ifdef _OPENMP
  return o.threads > 0 ? o.threads : omp_get_max_threads();
#else
  return std::max(1, o.threads);
#endif
}

// One slab of the input: a sequence, a captured layer, a KV head.
struct SlabRef {
  int sequence = 0, layer_index = 0, head = 0;
};

// Every selected slab in the order the file is written: sequence, layer, head.
std::vector<SlabRef> list_slabs(const std::vector<int>& seqs, const std::vector<int>& layers,
                                const std::vector<int>& heads) {
  std::vector<SlabRef> out;
  out.reserve(seqs.size() * layers.size() * heads.size());
  for (int s : seqs)
    for (int li : layers)
      for (int h : heads) out.push_back({s, li, h});
  return out;
}

// The slab's input as stored (decoded later, on a compute thread).
std::unique_ptr<SlabJob> read_slab(const TileReader& reader, const SlabRef& r,
                                   const std::string& out) {
  const TileFileInfo& info = reader.info();
  const SequenceInfo& si = reader.sequence(r.sequence);
  auto j = std::make_unique<SlabJob>();
  j->key = {si.name,       si.num_tokens, si.prompt_id, info.layers[r.layer_index],
            r.layer_index, r.head};
  j->ctx = LayerContext{info.layers[r.layer_index], info.num_layers};
  j->where = out + ": /sequences/" + si.name + "/" +
             quantized_group_name("layer", info.layers[r.layer_index]) + "/" +
             quantized_group_name("head", r.head);
  j->k_in = reader.read_stored(r.sequence, "k", r.layer_index, r.head);
  j->v_in = reader.read_stored(r.sequence, "v", r.layer_index, r.head);
  return j;
}

QuantizedFileInfo file_info(const Method& method, const QuantizeFileOptions& o,
                            const TileReader& reader, const std::vector<int>& heads,
                            const std::vector<int>& seqs) {
  const TileFileInfo& info = reader.info();
  const bool parsed = !nlohmann::json::parse(info.provenance, nullptr, false).is_discarded();
  const char* commit = std::getenv("KVARN_GIT_COMMIT");
  const nlohmann::json prov = {
      {"tool", "kvarn-eval quantize"},
      {"version", kKvarnEvalVersion},
      {"git_commit", commit ? commit : "unknown"},
      {"created", utc_timestamp()},
      {"command", o.command},
      {"method", method.name()},
      {"method_spec", method.spec()},
      {"selection", {{"layers", o.layers}, {"heads", heads}, {"sequences", seqs}}},
      {"input",
       {{"path", o.in.string()},
        {"model", info.model},
        {"source", info.source},
        {"provenance",
         parsed ? nlohmann::json::parse(info.provenance) : nlohmann::json(info.provenance)}}}};
  QuantizedFileInfo q;
  q.method = method.name();
  q.method_spec = method.spec();
  q.source_file = o.in.string();
  q.model = info.model;
  q.num_layers = info.num_layers;
  q.head_dim = info.head_dim;
  q.reconstruction = o.reconstruction;
  q.provenance = prov.dump();
  return q;
}

void add_to_report(const SlabJob& j, QuantizeReport* rep) {
  QuantizeLayerSummary& ls = rep->layers[j.key.model_layer];
  ls.k_err += j.k_err;
  ls.k_ref += j.k_ref;
  ls.v_err += j.v_err;
  ls.v_ref += j.v_ref;
  ls.stored += static_cast<std::size_t>(j.out.stored_bytes);
  ls.fp16 += static_cast<std::size_t>(j.out.fp16_bytes);
  ++ls.slabs;
  ++rep->slabs;
  rep->k_chunks += j.out.k.num_chunks();
  rep->v_chunks += j.out.v.num_chunks();
  rep->times.decode += j.decode_s;
  rep->times.quantize += j.quantize_s;
  rep->times.collect += j.collect_s;
  rep->times.metrics += j.metrics_s;
  rep->times.compute_cpu += j.compute_cpu_s;
}

// Slabs flow through a fixed set of threads, as many as asked for, with no barriers: each
// thread, in turn, either takes the HDF5 turn (write the oldest quantized slabs, or read the next
// slabs' stored chunks, up to kIoBatch in one turn; one thread at a time, HDF5 is not
// thread-safe) or decodes and quantizes a slab that was read. The HDF5 work takes turns with the
// quantization on the same threads instead of competing with it for the cores from an extra
// thread, and no thread waits at a batch's end. Slabs are written in list order; at most
// `window` are in memory.
class Pipeline {
 public:
  Pipeline(const Method& method, const QuantizeFileOptions& o, const TileReader& reader,
           QuantizedFileWriter* writer, std::vector<SlabRef> slabs, int threads,
           QuantizeReport* rep)
      : method_(method),
        o_(o),
        reader_(reader),
        writer_(writer),
        slabs_(std::move(slabs)),
        threads_(std::max(1, threads)),
        window_(static_cast<std::size_t>(4 * threads_ + 2) + kIoBatch),
        rep_(rep),
        jobs_(slabs_.size()),
        done_(slabs_.size(), 0),
        stop_at_(slabs_.size()),
        error_at_(slabs_.size()) {}

  // Runs every slab; rethrows the error of the first slab, in list order, that failed.
  void run() {
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads_; ++t) {
      try {
        helpers.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // fewer threads than asked for: the same file, later
      }
    }
    work();
    for (std::thread& t : helpers) t.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  enum class Io { kNone, kRead, kWrite };

  // Quantized slabs from next_write_ on that can be written now, in order (at most kIoBatch).
  std::size_t writable() const {
    std::size_t n = 0;
    while (n < kIoBatch && next_write_ + n < stop_at_ && done_[next_write_ + n]) ++n;
    return n;
  }

  bool can_read() const { return next_read_ < stop_at_ && next_read_ - next_write_ < window_; }
  bool can_compute() const { return next_take_ < std::min(next_read_, stop_at_); }

  // The HDF5 turn to take now, if any (called under mu_). Reads come first while fewer slabs wait
  // than there are threads, so that no thread starves; writes wait until a batch is ready or
  // nothing is left to quantize; otherwise quantizing comes first.
  Io next_io() const {
    if (can_read() && next_read_ - next_take_ < static_cast<std::size_t>(threads_))
      return Io::kRead;
    const std::size_t w = writable();
    if (w > 0 && (w == kIoBatch || !can_compute())) return Io::kWrite;
    if (can_compute()) return Io::kNone;
    if (can_read()) return Io::kRead;
    return w > 0 ? Io::kWrite : Io::kNone;
  }

  // One thread's loop: runs until every slab is written or, after an error, until nothing
  // before the failed slab is left to quantize.
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      const Io io = io_busy_ ? Io::kNone : next_io();
      if (io != Io::kNone) {
        io_step(io, &lock);
      } else if (can_compute()) {
        compute_step(&lock);
      } else if (io_busy_ || in_flight_ > 0) {
        cv_.wait(lock);  // whoever is busy changes the state and wakes everyone
      } else {
        return;
      }
    }
  }

  // One HDF5 turn: up to kIoBatch reads (or writes) of consecutive slabs, each published as soon
  // as it is done. Several slabs per turn keep the library's code and metadata cache warm, which
  // a compute step in between evicts.
  void io_step(Io io, std::unique_lock<std::mutex>* lock) {
    io_busy_ = true;
    for (std::size_t n = 0; n < kIoBatch; ++n) {
      const bool more = io == Io::kRead ? can_read() : writable() > 0;
      if (!more || !io_one(io, lock)) break;
    }
    io_busy_ = false;
    cv_.notify_all();
  }

  // Reads or writes the next slab (called under mu_, with the HDF5 turn held); false on error.
  bool io_one(Io io, std::unique_lock<std::mutex>* lock) {
    const std::size_t i = io == Io::kRead ? next_read_ : next_write_;
    std::unique_ptr<SlabJob> job = io == Io::kWrite ? std::move(jobs_[i]) : nullptr;
    lock->unlock();
    std::exception_ptr error;
    try {
      const StepTimer timer;
      if (io == Io::kRead) {
        job = read_slab(reader_, slabs_[i], o_.out.string());
        timer.add_to(&rep_->times.read, &rep_->times.read_cpu);
      } else {
        writer_->add_slab(job->key, job->out);
        add_to_report(*job, rep_);
        job.reset();
        timer.add_to(&rep_->times.write, &rep_->times.write_cpu);
      }
    } catch (...) {
      error = std::current_exception();
    }
    lock->lock();
    if (error) {
      fail_at(i, error);
      return false;
    }
    if (io == Io::kRead) {
      jobs_[i] = std::move(job);
      ++next_read_;
      cv_.notify_all();  // a waiting thread can take the slab now
    } else {
      ++next_write_;
    }
    return true;
  }

  void compute_step(std::unique_lock<std::mutex>* lock) {
    const std::size_t i = next_take_++;
    SlabJob* job = jobs_[i].get();
    ++in_flight_;
    lock->unlock();
    std::exception_ptr error;
    try {
      quantize_slab(method_, o_.reconstruction, job);
    } catch (...) {
      error = std::current_exception();
    }
    lock->lock();
    --in_flight_;
    if (error) fail_at(i, error);
    done_[i] = 1;
    cv_.notify_all();
  }

  // Slab i failed: nothing from i on is read, quantized or written; slabs before i are still
  // quantized, so the error reported is the first in list order, whatever the thread count.
  void fail_at(std::size_t i, std::exception_ptr e) {
    stop_at_ = std::min(stop_at_, i);
    if (i < error_at_) {
      error_at_ = i;
      error_ = e;
    }
  }

  const Method& method_;
  const QuantizeFileOptions& o_;
  const TileReader& reader_;
  QuantizedFileWriter* writer_;
  const std::vector<SlabRef> slabs_;
  static constexpr std::size_t kIoBatch = 16;  // slabs per HDF5 turn at most
  const int threads_;
  const std::size_t window_;
  QuantizeReport* rep_;  // written by the thread that holds the HDF5 turn

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<SlabJob>> jobs_;  // by slab: set once read, released once written
  std::vector<char> done_;                      // by slab: quantized
  std::size_t next_read_ = 0, next_take_ = 0, next_write_ = 0, stop_at_, error_at_;
  int in_flight_ = 0;
  bool io_busy_ = false;
  std::exception_ptr error_;
};

}  // namespace

QuantizeReport quantize_tile_file(const QuantizeFileOptions& o) {
  const auto t_start = Clock::now();
  // Validate the cheap things first, so bad input fails before any work.
  auto method = make_method(o.method);
  KVARN_CHECK(o.force || !fs::exists(o.out), o.out.string(),
              ": already exists (use --force to overwrite)");
  TileReader reader(o.in);
  {
    std::error_code ec;
    KVARN_CHECK(!fs::equivalent(o.in, o.out, ec), o.out.string(), ": --out is the input file");
  }
  const TileFileInfo& info = reader.info();
  method->check_head_dim(info.head_dim);
  const std::vector<int> layers = select_layers(reader, o.layers);
  const std::vector<int> heads = select_range(o.heads, info.num_kv_heads, "heads", o.in.string());
  const std::vector<int> seqs =
      select_range(o.sequences, reader.num_sequences(), "sequences", o.in.string());

  QuantizeReport rep;
  rep.method_name = method->name();
  rep.method_spec = method->spec();
  QuantizedFileWriter writer(o.out, file_info(*method, o, reader, heads, seqs), o.force);
  const auto t_pipeline = Clock::now();
  Pipeline(*method, o, reader, &writer, list_slabs(seqs, layers, heads), worker_threads(o), &rep)
      .run();
  rep.times.compute = seconds_since(t_pipeline);
  const StepTimer close;
  writer.finish();
  close.add_to(&rep.times.write, &rep.times.write_cpu);
  rep.times.total = seconds_since(t_start);
  return rep;
}

void keep_freed_memory_for_reuse() {
#ifdef __GLIBC__
  // Freed memory is returned to the kernel only past 256 MiB at the heap's top, blocks up to 32
  // MiB come from the heap (not mmap/munmap per block), and the heap grows 16 MiB at a time.
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TOP_PAD, 16 << 20);
#endif
}

}  // namespace kvarn
