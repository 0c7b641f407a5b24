// The paths a user runs, measured beside the core (same program, same run, so
// their ratios to BM_KvarnTilePair are meaningful on a loaded machine):
//   BM_QuantizeFile: `kvarn-eval quantize` end to end (tile file in, quantized file out, in a
//     temporary directory) on 1,024 kvarn_k4v2_g128 K+V tile pairs of synthetic tiles drawn
//     like BM_KvarnTilePair's; arg = threads (--threads). Counters: the CPU time per phase and
//     the process's CPU time per pair, which hold under load (compare with the CPU time per
//     pair of BM_KvarnTilePair). The tile file as TileWriter writes it by default (unfiltered);
//     BM_QuantizeFileGzip: the same on a gzip-compressed one (`capture --compress`, the files
//     under data/tiles/), which adds the inflate of every chunk.
//   BM_SweepCase: one sweep case (the engine's compute_case: quantization, reconstruction and
//     attention metrics) of kvarn_k4v2_g128 on the real fixture capture
//     data/tiles/fixture_heldout.h5.
// Both count quantized K+V tile pairs per second.
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "kvarn/sweeps/quantize.hpp"

namespace {

namespace fs = std::filesystem;

constexpr int kLayers = 8, kHeads = 8, kSequences = 2, kDim = 128, kTiles = 8;
constexpr int kTokens = 128 + kTiles * 128;  // fp16 sink of one group, then 8 tiles per slab

// A temporary directory for this process, removed at exit.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kvarn_bench_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
const fs::path& temp_dir() {
  static TempDir d;
  return d.path;
}

// Values like BM_KvarnTilePair's tiles: per channel an offset (large on every
// 17th channel) plus unit noise, rounded to fp16.
void fill_slab(float* out, std::uint64_t seed) {
  kvarn::Rng rng(seed);
  std::vector<double> offset(kDim);
  for (int c = 0; c < kDim; ++c) offset[c] = (c % 17 == 0) ? 8.0 : rng.normal() * 0.5;
  for (int t = 0; t < kTokens; ++t)
    for (int c = 0; c < kDim; ++c)
      out[static_cast<std::size_t>(t) * kDim + c] =
          kvarn::round_to_half(static_cast<float>(offset[c] + rng.normal()));
}

// CPU seconds of the whole process so far (every thread), user and system, and its page faults.
struct ProcessCpu {
  double user = 0, sys = 0, faults = 0;
  static ProcessCpu now() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    const auto sec = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    return {sec(u.ru_utime), sec(u.ru_stime), static_cast<double>(u.ru_minflt + u.ru_majflt)};
  }
};

// The input tile file, as TileWriter stores it by default (kNone) or gzip-compressed.
fs::path write_tile_file(kvarn::TileCompression compression) {
  const fs::path p =
      temp_dir() / (compression == kvarn::TileCompression::kGzip ? "tiles_gzip.h5" : "tiles.h5");
  kvarn::TileFileInfo info;
  info.model = "synthetic";
  info.num_layers = kLayers;
  info.num_kv_heads = kHeads;
  info.num_q_heads = kHeads;
  info.head_dim = kDim;
  info.source = "synthetic (bench/core_pipeline_bench.cpp)";
  for (int l = 0; l < kLayers; ++l) info.layers.push_back(l);
  kvarn::TileWriter w(p, info, true, compression);
  const std::size_t slab = static_cast<std::size_t>(kTokens) * kDim;
  for (int s = 0; s < kSequences; ++s) {
    kvarn::SequenceData seq;
    seq.prompt_id = "synthetic-" + std::to_string(s);
    seq.token_ids.assign(kTokens, 1);
    seq.k.resize(slab * kLayers * kHeads);
    seq.v.resize(slab * kLayers * kHeads);
    for (int i = 0; i < kLayers * kHeads; ++i) {
      fill_slab(seq.k.data() + i * slab, 1000 + 2 * (s * 64 + i));
      fill_slab(seq.v.data() + i * slab, 1001 + 2 * (s * 64 + i));
    }
    w.add_sequence(seq);
  }
  w.finish();
  return p;
}

// Each written once per process, when first asked for.
const fs::path& tile_file(kvarn::TileCompression compression) {
  if (compression == kvarn::TileCompression::kGzip) {
    static const fs::path gzip = write_tile_file(compression);
    return gzip;
  }
  static const fs::path plain = write_tile_file(compression);
  return plain;
}

void quantize_file(benchmark::State& state, kvarn::TileCompression compression) {
  kvarn::QuantizeFileOptions o;
  o.method = "kvarn_k4v2_g128";
  o.in = tile_file(compression);
  o.out = temp_dir() / "quantized.h5";
  o.force = true;
  o.threads = static_cast<int>(state.range(0));
  o.command = "bench";
  long long pairs = 0;
  kvarn::QuantizePhaseTimes t;
  kvarn::keep_freed_memory_for_reuse();  // as `kvarn-eval quantize` does
  ProcessCpu cpu;
  for (auto _ : state) {
    const ProcessCpu cpu0 = ProcessCpu::now();
    const kvarn::QuantizeReport r = kvarn::quantize_tile_file(o);
    const ProcessCpu cpu1 = ProcessCpu::now();
    cpu.user += cpu1.user - cpu0.user;
    cpu.sys += cpu1.sys - cpu0.sys;
    cpu.faults += cpu1.faults - cpu0.faults;
    pairs += r.k_chunks;
    t += r.times;
  }
  state.counters["tile_pairs_per_s"] =
      benchmark::Counter(static_cast<double>(pairs), benchmark::Counter::kIsRate);
  const double n = static_cast<double>(state.iterations());
  state.counters["read_s"] = t.read / n;
  state.counters["compute_s"] = t.compute / n;
  state.counters["write_s"] = t.write / n;
  state.counters["read_cpu_s"] = t.read_cpu / n;
  state.counters["compute_cpu_s"] = t.compute_cpu / n;
  // The compute phases, summed over the worker threads: input inflate, the method's cache, the
  // stored fields, the NMSE.
  state.counters["decode_s"] = t.decode / n;
  state.counters["quantize_s"] = t.quantize / n;
  state.counters["collect_s"] = t.collect / n;
  state.counters["metrics_s"] = t.metrics / n;
  state.counters["write_cpu_s"] = t.write_cpu / n;
  // Process CPU time per tile pair, all threads: a rate that holds under load, to compare with
  // the CPU time per pair of BM_KvarnTilePair.
  state.counters["cpu_us_per_pair"] = 1e6 * (cpu.user + cpu.sys) / static_cast<double>(pairs);
  state.counters["sys_us_per_pair"] = 1e6 * cpu.sys / static_cast<double>(pairs);
  state.counters["page_faults"] = cpu.faults / n;
}
void BM_QuantizeFile(benchmark::State& state) {
  quantize_file(state, kvarn::TileCompression::kNone);
}
void BM_QuantizeFileGzip(benchmark::State& state) {
  quantize_file(state, kvarn::TileCompression::kGzip);
}
BENCHMARK(BM_QuantizeFile)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_QuantizeFileGzip)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// KVarN g128 tile pairs a case over `tiles` quantizes: per slab (T - sink) /
// 128 per stream.
long long case_tile_pairs(const kvarn::SweepConfig& cfg) {
  long long pairs = 0;
  for (const auto& t : cfg.data.tiles) {
    const kvarn::TileReader r(t.resolved);
    for (int s = 0; s < r.num_sequences(); ++s) {
      const int T = r.sequence(s).num_tokens;
      pairs += static_cast<long long>(std::max(0, (T - 128) / 128)) *
               r.info().num_captured_layers() * r.info().num_kv_heads;
    }
  }
  return pairs;
}

void BM_SweepCase(benchmark::State& state) {
  const fs::path yaml = temp_dir() / "case.yaml";
  {
    std::ofstream f(yaml);
    f << "version: 1\nname: bench\ndata:\n  tiles: " << KVARN_SOURCE_DIR
      << "/data/tiles/fixture_heldout.h5\nmethods:\n  - kvarn_k4v2_g128\n"
      << "metrics:\n  reconstruction: true\n  attention: true\n  arrays: "
         "false\n"
      << "accumulation: {enabled: false}\noutput: " << (temp_dir() / "runs").string()
      << "\nreport: false\n";
  }
  const kvarn::SweepConfig cfg = kvarn::load_config(yaml);
  const long long pairs = case_tile_pairs(cfg);
  for (auto _ : state) {
    nlohmann::json rec = kvarn::compute_case(cfg, cfg.cases.at(0), fs::path());
    benchmark::DoNotOptimize(rec);
  }
  state.counters["tile_pairs_per_s"] =
      benchmark::Counter(static_cast<double>(pairs) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SweepCase)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
