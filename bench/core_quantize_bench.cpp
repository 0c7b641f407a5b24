// CPU reference throughput: K+V tile pairs per second per method (G = D = 128 unless the method
// says otherwise), 1 and 2 threads. Target: kvarn_k4v2_g128 >= 5,000 pairs/s on 2 cores.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"

namespace {

using kvarn::Matrix;

Matrix random_tile(int rows, int cols, std::uint64_t seed) {
  kvarn::Rng rng(seed);
  Matrix m(rows, cols);
  for (int c = 0; c < cols; ++c) {
    const double offset = (c % 17 == 0) ? 8.0 : rng.normal() * 0.5;
    for (int r = 0; r < rows; ++r) m(r, c) = kvarn::round_to_half(static_cast<float>(offset + rng.normal()));
  }
  return m;
}

// The raw tile path: one K tile and one V tile into a record (what the store kernel does), with
// the exact-scale fp32 FWHT (rotation=hadamard_exact) as since the first version of this
// benchmark; BM_KvarnTilePairFp16Rotation: the same with KVarN's default rotation (the published
// fp16 matrix), the tile path of `kvarn_k4v2_g128`.
void tile_pair(benchmark::State& state, kvarn::RotationKind rotation) {
  const int d = 128, g = static_cast<int>(state.range(0));
  kvarn::KvarnConfig cfg;
  cfg.key_bits = 4;
  cfg.value_bits = static_cast<int>(state.range(1));
  cfg.group = g;
  cfg.rotation = rotation;
  kvarn::Rotation rot(rotation, d);
  Matrix k = random_tile(g, d, 1 + state.thread_index()), v = random_tile(g, d, 100 + state.thread_index());
  for (auto _ : state) {
    auto rec = kvarn::kvarn_encode_record(cfg, rot, k.data(), v.data());
    benchmark::DoNotOptimize(rec.data());
  }
  state.counters["tile_pairs_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
void BM_KvarnTilePair(benchmark::State& state) { tile_pair(state, kvarn::RotationKind::kHadamard); }
void BM_KvarnTilePairFp16Rotation(benchmark::State& state) {
  tile_pair(state, kvarn::RotationKind::kHadamardFp16);
}
BENCHMARK(BM_KvarnTilePairFp16Rotation)->Args({128, 2})->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_KvarnTilePair)->Args({128, 2})->Args({128, 4})->Args({64, 2})->Threads(1)->Threads(2)->UseRealTime();

// One channel-major 128 x 128 tile through the forward rotation as the store does it
// (forward_columns_fp16): arg 1 the fp16 Hadamard matrix (KVarN's default), arg 0 the exact-scale
// fp32 FWHT. The tile is copied in each iteration (the rotation works in place).
void BM_RotateTile(benchmark::State& state) {
  const int d = 128;
  const kvarn::Rotation rot(state.range(0) ? kvarn::RotationKind::kHadamardFp16
                                           : kvarn::RotationKind::kHadamard,
                            d);
  const Matrix x = random_tile(d, d, 5);
  Matrix y = x;
  for (auto _ : state) {
    y = x;
    rot.forward_columns_fp16(y.data(), d);
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_RotateTile)->Arg(1)->Arg(0);

// Any registry method through the generic cache path: a sequence of 128 sink tokens + 8 tiles;
// counts quantized tile pairs (128 tokens of K and V) per second.
void BM_MethodSequence(benchmark::State& state, const char* name) {
  auto m = kvarn::make_method(name);
  const int d = 128, tiles = 8, t = 128 + tiles * 128;
  Matrix k = random_tile(t, d, 7 + state.thread_index()), v = random_tile(t, d, 9 + state.thread_index());
  for (auto _ : state) {
    auto r = kvarn::quantize_sequence(*m, k, v);
    benchmark::DoNotOptimize(r.k_hat.data());
  }
  state.counters["tile_pairs_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * tiles, benchmark::Counter::kIsRate);
}

void register_all() {
  std::vector<std::string> names;
  for (const auto& p : kvarn::Registry::instance().presets()) names.push_back(p.name);
  // The cache path with the tile path's arithmetic of BM_KvarnTilePair.
  names.push_back("kvarn:k=4,v=2,g=128,rotation=hadamard_exact");
  for (const std::string& name : names) {
    benchmark::RegisterBenchmark(("BM_MethodSequence/" + name).c_str(),
                                 [name](benchmark::State& s) { BM_MethodSequence(s, name.c_str()); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
