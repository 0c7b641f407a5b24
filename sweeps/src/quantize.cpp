#include "kvarn/sweeps/quantize.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
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

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

// sum (hat - ref)^2 and sum ref^2 in double, one pass in index order: the same sums, bit for
// bit, as Eigen's squaredNorm of the cast expressions (a sequential, unvectorized reduction).
void err_and_ref(const Matrix& hat, const Matrix& ref, double* err, double* sq) {
  const float* a = hat.data();
  const float* b = ref.data();
  const std::size_t n = static_cast<std::size_t>(ref.size());
  double e = 0, r = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = b[i];
    const double d = static_cast<double>(a[i]) - x;
    e += d * d;
    r += x * x;
  }
  *err = e;
  *sq = r;
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
};

void collect_slab(const Method& method, SequenceResult* r, SlabJob* job) {
  const int T = static_cast<int>(job->k.rows()), D = static_cast<int>(job->k.cols());
  auto kc = method.make_codec(StreamKind::kKey, D, job->ctx);
  auto vc = method.make_codec(StreamKind::kValue, D, job->ctx);
  QuantizedSlab& s = job->out;
  s.num_tokens = T;
  s.k = collect_stream(r->k_chunks, *kc, r->k_quantized, job->where + "/k");
  s.v = collect_stream(r->v_chunks, *vc, r->v_quantized, job->where + "/v");
  const std::size_t stored = s.k.payload_bytes() + s.v.payload_bytes() +
                             s.k.kept_tokens * kc->kept_token_bytes() +
                             s.v.kept_tokens * vc->kept_token_bytes();
  const std::size_t accounted = method.sequence_bytes(T, D, job->ctx);
  KVARN_CHECK(stored == r->stored_bytes, job->where, ": wrote ", stored,
              " bytes but the cache measured ", r->stored_bytes);
  KVARN_CHECK(stored == accounted, job->where, ": stored ", stored,
              " bytes but Method::sequence_bytes accounts ", accounted, " (method ", method.spec(),
              ", ", T, " tokens)");
  s.stored_bytes = static_cast<long long>(stored);
  s.accounted_bytes = static_cast<long long>(accounted);
  s.fp16_bytes = 4LL * T * D;
  s.layer_skipped = method.layer_skipped(job->ctx);
  s.k_quantized = std::move(r->k_quantized);
  s.v_quantized = std::move(r->v_quantized);
}

// Decodes and quantizes one slab into job->out: the method's cache, the stored fields, the
// byte checks and the NMSE sums of both streams.
void quantize_slab(const Method& method, bool reconstruction, SlabJob* job) {
  auto t0 = Clock::now();
  job->k = decode_slab(job->k_in);
  job->v = decode_slab(job->v_in);
  job->k_in = StoredSlab();
  job->v_in = StoredSlab();
  job->decode_s = seconds_since(t0);
  t0 = Clock::now();
  SequenceResult r = quantize_sequence(method, job->k, job->v, job->ctx);
  job->quantize_s = seconds_since(t0);
  t0 = Clock::now();
  collect_slab(method, &r, job);
  job->collect_s = seconds_since(t0);
  t0 = Clock::now();
  err_and_ref(r.k_hat, job->k, &job->k_err, &job->k_ref);
  err_and_ref(r.v_hat, job->v, &job->v_err, &job->v_ref);
  job->out.k_nmse = job->k_ref > 0 ? job->k_err / job->k_ref : 0.0;
  job->out.v_nmse = job->v_ref > 0 ? job->v_err / job->v_ref : 0.0;
  job->metrics_s = seconds_since(t0);
  if (reconstruction) {
    job->out.k_hat.assign(r.k_hat.data(), r.k_hat.data() + r.k_hat.size());
    job->out.v_hat.assign(r.v_hat.data(), r.v_hat.data() + r.v_hat.size());
  }
  job->k.resize(0, 0);
  job->v.resize(0, 0);
}

int worker_threads(const QuantizeFileOptions& o) {
#ifdef _OPENMP
  return o.threads > 0 ? o.threads : omp_get_max_threads();
#else
  (void)o;
  return 1;
#endif
}

// Quantizes every job, in parallel over slabs; the first error (in slab order)
// is rethrown.
void quantize_all(const Method& method, const QuantizeFileOptions& o, std::vector<SlabJob>* jobs) {
  const int n = static_cast<int>(jobs->size());
  std::vector<std::exception_ptr> errors(n);
#ifdef _OPENMP
  const int threads = worker_threads(o);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
#endif
  for (int i = 0; i < n; ++i) {
    try {
      quantize_slab(method, o.reconstruction, &(*jobs)[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A batch: some layers of one sequence, every selected head. Small enough to bound memory and
// let reading overlap the quantization of the previous batch, large enough to keep every
// thread busy.
struct Batch {
  int sequence = 0;
  std::vector<int> layers;  // captured indices
};

std::vector<Batch> make_batches(const std::vector<int>& seqs, const std::vector<int>& layers,
                                int num_heads, int threads) {
  const int per_batch = std::max(1, (4 * threads + num_heads - 1) / std::max(1, num_heads));
  std::vector<Batch> out;
  for (int s : seqs) {
    for (std::size_t i = 0; i < layers.size(); i += per_batch) {
      Batch b{s, {}};
      for (std::size_t j = i; j < std::min(layers.size(), i + per_batch); ++j)
        b.layers.push_back(layers[j]);
      out.push_back(std::move(b));
    }
  }
  return out;
}

// The input slabs of one batch as stored (decoded later, in parallel), in layer / head order.
std::vector<SlabJob> read_batch(const TileReader& reader, const Batch& b,
                                const std::vector<int>& heads, const std::string& out) {
  const TileFileInfo& info = reader.info();
  const SequenceInfo& si = reader.sequence(b.sequence);
  std::vector<SlabJob> jobs;
  jobs.reserve(b.layers.size() * heads.size());
  for (int li : b.layers) {
    for (int h : heads) {
      SlabJob j;
      j.key = {si.name, si.num_tokens, si.prompt_id, info.layers[li], li, h};
      j.ctx = LayerContext{info.layers[li], info.num_layers};
      j.where = out + ": /sequences/" + si.name + "/" +
                quantized_group_name("layer", info.layers[li]) + "/" +
                quantized_group_name("head", h);
      j.k_in = reader.read_stored(b.sequence, "k", li, h);
      j.v_in = reader.read_stored(b.sequence, "v", li, h);
      jobs.push_back(std::move(j));
    }
  }
  return jobs;
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
}

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
  const std::vector<Batch> batches =
      make_batches(seqs, layers, static_cast<int>(heads.size()), worker_threads(o));
  auto read = [&](std::size_t b) {
    const auto t0 = Clock::now();
    std::vector<SlabJob> jobs = read_batch(reader, batches[b], heads, o.out.string());
    rep.times.read += seconds_since(t0);
    return jobs;
  };
  auto write = [&](const std::vector<SlabJob>& done) {
    const auto t0 = Clock::now();
    for (const SlabJob& j : done) {
      writer.add_slab(j.key, j.out);
      add_to_report(j, &rep);
    }
    rep.times.write += seconds_since(t0);
  };
  std::vector<SlabJob> jobs = batches.empty() ? std::vector<SlabJob>() : read(0), done;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    // While batch b is decoded and quantized in parallel (no HDF5 calls), one I/O thread writes
    // batch b - 1 and reads batch b + 1's stored chunks: HDF5 (not thread-safe) is only ever used
    // by one thread at a time, and the file is written in batch order.
    std::vector<SlabJob> next;
    std::exception_ptr io_error;
    std::thread io([&, b] {
      try {
        write(done);
        if (b + 1 < batches.size()) next = read(b + 1);
      } catch (...) {
        io_error = std::current_exception();
      }
    });
    const auto t0 = Clock::now();
    try {
      quantize_all(*method, o, &jobs);
    } catch (...) {
      io.join();
      throw;
    }
    rep.times.compute += seconds_since(t0);
    io.join();
    if (io_error) std::rethrow_exception(io_error);
    done = std::move(jobs);
    jobs = std::move(next);
  }
  write(done);
  const auto t0 = Clock::now();
  writer.finish();
  rep.times.write += seconds_since(t0);
  rep.times.total = seconds_since(t_start);
  return rep;
}

}  // namespace kvarn
