// PyTorch SDPA decode anchor through libtorch, the external FP16 reference of the decode sweep.
// It measures what scripts/gpu_sdpa.py measures (that script stays as fallback and cross-check):
// fp16 q [B, Hq, 1, 128], contiguous K/V [B, Hkv, T, 128] from randn, enable_gqa (no K/V repeat),
// the flash backend alone (as sdpa_kernel(FLASH_ATTENTION)), else the default backends; same
// shapes and memory cap as bench/gpu_decode_bench.cu. Google Benchmark, manual timing with CUDA
// events, median of 25 repetitions (7 above 20 GB); before every repetition the L2 is flushed by
// reading a buffer of three times its size, as gpu_decode_bench does. After timing, the output
// must be finite and, with constant K rows and a V channel pattern, equal that pattern (uniform
// attention); a shape that fails reports an error instead of a time. Each step is
// also captured once into a CUDA graph and replayed, as gpu_decode_bench does for our kernels:
// time_s is the graph median (the eager median is kept in time_eager_s), eager where capture
// fails. Only torch's compiled CUDA entry points are used (no direct CUDA runtime calls), so the
// binary runs against the wheel's own runtime whatever the toolkit's version.
//
// Flags (the rest go to Google Benchmark, e.g. --benchmark_filter=hq32/hkv8/b8/):
//   --out=FILE     JSON list as gpu_sdpa.py writes it: {hq, hkv, batch, ctx, time_s, kv_bytes,
//                  backend} plus time_eager_s, time_graph_s, graph, reps, flush,
//                  closed_form_max_err, source
//   --budget=S     no new shape is started after S seconds (default 120)
//   --max_kv_gib=G skip shapes whose K+V exceed G GiB (default 100, as gpu_decode_bench)
//   --no_graph     eager timing only
//   --torch_version  print the torch version this binary was built against and exit
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <benchmark/benchmark.h>
#include <c10/core/Event.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"

#ifndef KVARN_SDPA_TORCH_VERSION
#define KVARN_SDPA_TORCH_VERSION "unknown"
#endif

namespace {

constexpr int kHeadDim = 128;
constexpr double kFewRepsAboveBytes = 20e9;

struct Options {
  std::string out;
  double budget_s = 120.0;
  double max_kv_gib = 100.0;
  bool graph = true;
};
Options g_opt;
const auto g_start = std::chrono::steady_clock::now();
nlohmann::json g_results = nlohmann::json::array();

double elapsed_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

// The one stream every measurement runs on (graph capture needs a non-default stream).
c10::Stream bench_stream() {
  static const c10::Stream s = c10::cuda::getStreamFromPool().unwrap();
  return s;
}

// Reads a buffer of three times the L2 (the flush must read at least twice the L2: a write
// would leave dirty lines whose write-back lands in the timed step).
void flush_l2_by_reading() {
  // never freed: a static tensor would be destroyed after the CUDA context at exit
  static at::Tensor& buf = *new at::Tensor([] {
    const std::int64_t l2 = at::cuda::getCurrentDeviceProperties()->l2CacheSize;
    return at::randint(0, 1 << 30, {(3 * l2 + 3) / 4},
                       at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
  }());
  static at::Tensor& sink = *new at::Tensor(
      at::empty({}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA)));
  at::sum_out(sink, buf);
}

// Runs f() `reps` times between timing events (two warm-up calls first), median in seconds,
// the L2 flushed by reading before every repetition.
template <typename F>
double time_median(F&& f, int reps) {
  const c10::Stream st = bench_stream();
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    flush_l2_by_reading();
    c10::Event a(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event b(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    a.record(st);
    f();
    b.record(st);
    b.synchronize();
    ms.push_back(a.elapsedTime(b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3;
}

// Channel pattern of the closed-form check (as gpu_decode_bench): smooth, signed, not constant.
at::Tensor channel_pattern(float phase) {
  const at::Tensor x = at::arange(kHeadDim, at::TensorOptions().dtype(at::kFloat));
  return (0.8 * at::sin(0.37 * x + phase) + 0.1).to(at::kCUDA).to(at::kHalf);
}

// Empty when `timed` is finite and, over constant K rows and a V channel pattern, the output is
// that pattern within 4e-3 of its largest element; else what failed. Overwrites k and v.
template <typename Run>
std::string check_output(const at::Tensor& timed, at::Tensor& k, at::Tensor& v, Run&& run,
                         double* max_err) {
  if (!at::isfinite(timed).all().item<bool>()) return "non-finite output";
  k.copy_(channel_pattern(0.3f).expand_as(k));
  const at::Tensor vp = channel_pattern(1.1f);
  v.copy_(vp.expand_as(v));
  const at::Tensor out = run().to(at::kFloat);
  if (!at::isfinite(out).all().item<bool>()) return "non-finite closed-form output";
  *max_err = (out - vp.to(at::kFloat)).abs().max().item<double>();
  const double bound = 4e-3 * vp.to(at::kFloat).abs().max().item<double>() + 1e-4;
  if (*max_err > bound)
    return "closed-form output off by " + std::to_string(*max_err) + " > " + std::to_string(bound);
  return "";
}

// Flash only, as torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION); restores the
// user's backend flags (the "default" fallback) when it goes out of scope.
class FlashOnly {
 public:
  FlashOnly()
      : flash_(ctx().userEnabledFlashSDP()),
        mem_(ctx().userEnabledMemEfficientSDP()),
        math_(ctx().userEnabledMathSDP()),
        cudnn_(ctx().userEnabledCuDNNSDP()) {
    set(true, false, false, false);
  }
  ~FlashOnly() { set(flash_, mem_, math_, cudnn_); }
  FlashOnly(const FlashOnly&) = delete;
  FlashOnly& operator=(const FlashOnly&) = delete;

 private:
  static at::Context& ctx() { return at::globalContext(); }
  static void set(bool flash, bool mem, bool math, bool cudnn) {
    ctx().setSDPUseFlash(flash);
    ctx().setSDPUseMemEfficient(mem);
    ctx().setSDPUseMath(math);
    ctx().setSDPUseCuDNN(cudnn);
  }
  bool flash_, mem_, math_, cudnn_;
};

struct Shape {
  int hq, hkv, batch, ctx;
};

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                                          /*is_causal=*/false, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/true);
}

void measure(benchmark::State& state, Shape c) {
  c10::InferenceMode no_autograd;
  c10::StreamGuard on_stream(bench_stream());
  const std::int64_t kv_bytes = 4LL * c.batch * c.hkv * c.ctx * kHeadDim;
  const auto opt = at::TensorOptions().dtype(at::kHalf).device(at::kCUDA);
  at::manual_seed(0);
  at::Tensor q = at::randn({c.batch, c.hq, 1, kHeadDim}, opt);
  at::Tensor k = at::randn({c.batch, c.hkv, c.ctx, kHeadDim}, opt);
  at::Tensor v = at::randn_like(k);
  std::string backend = "flash";
  bool flash = true;
  try {
    FlashOnly only;
    sdpa(q, k, v);
  } catch (const c10::Error&) {
    backend = "default";
    flash = false;
    sdpa(q, k, v);
  }
  auto run = [&] {
    if (!flash) return sdpa(q, k, v);
    FlashOnly only;
    return sdpa(q, k, v);
  };
  const int reps = kv_bytes > kFewRepsAboveBytes ? 7 : 25;
  const double eager_s = time_median(run, reps);
  at::Tensor timed = run();
  std::optional<double> graph_s;
  if (g_opt.graph) {
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    at::Tensor out;
    try {
      graph->capture_begin();
      out = run();
      graph->capture_end();
      graph_s = time_median([&] { graph->replay(); }, reps);
      timed = out.clone();
    } catch (const c10::Error& e) {
      try {
        graph->capture_end();  // leave capture mode if the failure happened inside it
      } catch (const c10::Error&) {
      }
      std::fprintf(stderr,
                   "sdpa_bench: CUDA graph capture failed at hq%d b%d ctx%d (%s); "
                   "eager timing from here on\n",
                   c.hq, c.batch, c.ctx, e.what_without_backtrace());
      g_opt.graph = false;
    }
    out.reset();
    graph.reset();
  }
  const double t = graph_s.value_or(eager_s);
  for (auto _ : state) state.SetIterationTime(t);
  double max_err = 0;
  const std::string bad = check_output(timed, k, v, run, &max_err);
  if (!bad.empty()) {
    std::fprintf(stderr, "sdpa_bench: hq%d b%d ctx%d: %s\n", c.hq, c.batch, c.ctx, bad.c_str());
    state.SkipWithError(("output check failed: " + bad).c_str());
    return;
  }
  state.counters["closed_form_max_err"] = max_err;
  state.counters["kv_bytes"] = static_cast<double>(kv_bytes);
  state.counters["TBps"] = static_cast<double>(kv_bytes) / t * 1e-12;
  state.counters["eager_us"] = eager_s * 1e6;
  state.counters["graph"] = graph_s ? 1 : 0;
  state.SetLabel(backend);
  nlohmann::json r = {{"hq", c.hq},
                      {"hkv", c.hkv},
                      {"batch", c.batch},
                      {"ctx", c.ctx},
                      {"time_s", t},
                      {"kv_bytes", kv_bytes},
                      {"backend", backend},
                      {"time_eager_s", eager_s},
                      {"graph", graph_s.has_value()},
                      {"reps", reps},
                      {"flush", "read 3x L2 before every repetition"},
                      {"closed_form_max_err", max_err},
                      {"source", "libtorch " KVARN_SDPA_TORCH_VERSION}};
  r["time_graph_s"] = graph_s ? nlohmann::json(*graph_s) : nlohmann::json(nullptr);
  g_results.push_back(std::move(r));
}

void BM_Sdpa(benchmark::State& state, Shape c) {
  std::string error;
  if (elapsed_s() > g_opt.budget_s) {
    error = "time budget exhausted";
  } else {
    try {
      measure(state, c);
    } catch (const c10::Error& e) {  // e.g. out of memory: this shape only
      error = std::string("torch: ") + e.what_without_backtrace();
    }
  }
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    for (auto _ : state) {
    }
  }
}

double parse_number(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVARN_CHECK(used == text.size() && v > 0, "sdpa_bench: ", flag, " needs a positive number, got '",
              text, "'");
  return v;
}

// Takes this program's flags out of argv (Google Benchmark rejects unknown ones).
void parse_flags(int* argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> std::optional<std::string> {
      const std::string p = std::string(name) + "=";
      if (a.rfind(p, 0) == 0) return a.substr(p.size());
      return std::nullopt;
    };
    if (auto v = value("--out")) {
      KVARN_CHECK(!v->empty(), "sdpa_bench: --out needs a file name");
      g_opt.out = *v;
    } else if (auto b = value("--budget")) {
      g_opt.budget_s = parse_number("--budget", *b);
    } else if (auto m = value("--max_kv_gib")) {
      g_opt.max_kv_gib = parse_number("--max_kv_gib", *m);
    } else if (a == "--no_graph") {
      g_opt.graph = false;
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
}

int run_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--torch_version") {
      std::printf("%s\n", KVARN_SDPA_TORCH_VERSION);
      return 0;
    }
  }
  parse_flags(&argc, argv);
  for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{32, 8}, {64, 8}})
    for (int batch : {1, 8, 32, 128})
      for (int ctx : {1024, 2048, 4096, 16384, 32768, 65536, 131072}) {
        const double kv_bytes = 4.0 * batch * hkv * static_cast<double>(ctx) * kHeadDim;
        if (kv_bytes > g_opt.max_kv_gib * (1ULL << 30)) continue;
        const Shape c{hq, hkv, batch, ctx};
        const std::string name = "sdpa/hq" + std::to_string(hq) + "/hkv" + std::to_string(hkv) +
                                 "/b" + std::to_string(batch) + "/ctx" + std::to_string(ctx);
        benchmark::RegisterBenchmark(name.c_str(), [c](benchmark::State& s) { BM_Sdpa(s, c); })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
      }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  if (!at::hasCUDA() || c10::cuda::device_count() == 0) {
    std::fprintf(stderr, "sdpa_bench: no CUDA device (or a CPU-only torch); nothing measured\n");
    return 0;
  }
  int rc = 0;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const c10::Error& e) {  // e.g. a sticky CUDA error: keep the shapes measured so far
    std::fprintf(stderr, "sdpa_bench: stopped: %s\n", e.what_without_backtrace());
    rc = 1;
  }
  benchmark::Shutdown();
  if (!g_opt.out.empty()) kvarn::write_text_atomically(g_opt.out, g_results.dump(1) + "\n");
  std::fprintf(stderr, "sdpa_bench: %zu shapes in %.0f s%s%s\n", g_results.size(), elapsed_s(),
               g_opt.out.empty() ? "" : " -> ", g_opt.out.c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const kvarn::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "sdpa_bench: torch error: %s\n", e.what_without_backtrace());
    return 1;
  }
}
