// The runner against HF transformers on tiny random checkpoints of every architecture, the KV
// cache with registry methods in the loop, and the error paths of loading.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cuda_load.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/runner/model.hpp"
#include "kvarn/runner/runner.hpp"
#include "kvarn/runner/safetensors.hpp"
#include "runner_test_util.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelError = 1e-4;

Matrix reference_logits(const fs::path& file) {
  SafetensorsFile f(file);
  const auto& info = f.info("logits");
  Matrix m(info.shape[0], info.shape[1]);
  std::memcpy(m.data(), f.data(info), info.end - info.begin);
  return m;
}

std::vector<std::int32_t> ids(const nlohmann::json& j) {
  return j.get<std::vector<std::int32_t>>();
}

double rel(const Matrix& a, const Matrix& b) {
  return relative_error(a.data(), b.data(), static_cast<std::size_t>(a.size()));
}

class Architectures : public ::testing::TestWithParam<std::string> {};

TEST_P(Architectures, MatchesTransformers) {
  KVARN_REFERENCE_DIR(ref);
  const std::string name = GetParam();
  const auto r = test::reference_json(ref)["models"][name];
  const auto dir = ref / "models" / name;
  auto model = Model::load(dir);
  const auto tokens = ids(r["tokens"]);
  const Matrix want = reference_logits(dir / "reference.safetensors");

  // Prefill of the whole sequence: every position's logits.
  auto cache = model->make_cache("exact");
  ForwardOptions all;
  all.logits = LogitsMode::kAll;
  const auto res = model->forward(cache, tokens, all);
  ASSERT_EQ(res.logits.rows(), want.rows());
  ASSERT_EQ(res.logits.cols(), want.cols());
  const double e_prefill = rel(res.logits, want);
  EXPECT_LE(e_prefill, kMaxRelError) << name;
  EXPECT_EQ(cache.size(), static_cast<int>(tokens.size()));

  // The same sequence one token at a time (decode path), and in uneven blocks.
  auto step_cache = model->make_cache("exact");
  Matrix steps(want.rows(), want.cols());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto l = model->decode_step(step_cache, tokens[i]);
    std::memcpy(steps.row(i).data(), l.data(), l.size() * sizeof(float));
  }
  const double e_decode = rel(steps, want);
  EXPECT_LE(e_decode, kMaxRelError) << name;
  auto block_cache = model->make_cache("exact");
  Matrix blocks(want.rows(), want.cols());
  for (std::size_t i = 0; i < tokens.size(); i += 7) {
    const std::size_t n = std::min<std::size_t>(7, tokens.size() - i);
    const auto b = model->forward(block_cache, std::span(tokens).subspan(i, n), all);
    blocks.middleRows(i, n) = b.logits;
  }
  EXPECT_LE(rel(blocks, want), kMaxRelError) << name;

  // 128 greedy tokens, exactly.
  auto gen_cache = model->make_cache("exact");
  const auto greedy = model->generate_greedy(gen_cache, ids(r["prompt"]), 128);
  EXPECT_EQ(greedy, ids(r["greedy"])) << name;
  std::printf(
      "[ runner ] %-10s stored %-8s prefill rel err %.2e, decode rel err %.2e, greedy "
      "128/128 %s\n",
      name.c_str(), r["dtype"].get<std::string>().c_str(), e_prefill, e_decode,
      greedy == ids(r["greedy"]) ? "equal" : "DIFFER");

  // The same on CUDA when a device exists (fp32, no TF32); any other load error fails.
  std::string no_device;
  const auto gpu = test::load_on_cuda(dir, &no_device);
  if (gpu == nullptr) {
    if (!no_device.empty())
      std::printf("[ runner ] %-10s CUDA part not run: %s\n", name.c_str(), no_device.c_str());
    return;
  }
  auto gc = gpu->make_cache("exact");
  const double e_gpu = rel(gpu->forward(gc, tokens, all).logits, want);
  EXPECT_LE(e_gpu, kMaxRelError) << name << " on CUDA";
  auto gg = gpu->make_cache("exact");
  const auto greedy_gpu = gpu->generate_greedy(gg, ids(r["prompt"]), 128);
  EXPECT_EQ(greedy_gpu, ids(r["greedy"])) << name << " on CUDA";
  std::printf("[ runner ] %-10s on %s: prefill rel err %.2e, greedy 128/128 %s\n", name.c_str(),
              gpu->device().c_str(), e_gpu, greedy_gpu == ids(r["greedy"]) ? "equal" : "DIFFER");
}

INSTANTIATE_TEST_SUITE_P(Reference, Architectures,
                         ::testing::Values("llama3", "qwen2", "qwen3", "mistral", "llama_hd64"));

TEST(ModelKv, Fp16MethodEqualsExactFp16Cache) {
  KVARN_REFERENCE_DIR(ref);
  const auto dir = ref / "models/llama_hd64";
  auto model = Model::load(dir);
  const auto tokens = ids(test::reference_json(ref)["models"]["llama_hd64"]["tokens"]);
  ForwardOptions all;
  all.logits = LogitsMode::kAll;
  for (auto mode : {ChunkAttention::kExact, ChunkAttention::kCache}) {
    all.chunk_attention = mode;
    auto exact16 = model->make_cache("exact_fp16");
    auto method16 = model->make_cache("fp16");
    auto exact32 = model->make_cache("exact");
    Matrix a(0, 0), b(0, 0), c(0, 0);
    for (std::size_t i = 0; i < tokens.size(); i += 8) {
      auto chunk = std::span(tokens).subspan(i, std::min<std::size_t>(8, tokens.size() - i));
      auto ra = model->forward(exact16, chunk, all).logits;
      auto rb = model->forward(method16, chunk, all).logits;
      auto rc = model->forward(exact32, chunk, all).logits;
      a.conservativeResize(a.rows() + ra.rows(), ra.cols());
      a.bottomRows(ra.rows()) = ra;
      b.conservativeResize(b.rows() + rb.rows(), rb.cols());
      b.bottomRows(rb.rows()) = rb;
      c.conservativeResize(c.rows() + rc.rows(), rc.cols());
      c.bottomRows(rc.rows()) = rc;
    }
    EXPECT_TRUE(a == b) << "fp16 method and exact fp16 cache must agree bit for bit";
    EXPECT_LE(rel(b, c), 1e-2);  // fp16 rounding only
    EXPECT_GT(rel(b, c), 0.0);
    for (int l = 0; l < model->config().num_layers; ++l) {
      EXPECT_TRUE(method16.keys(l, 0) == exact16.keys(l, 0));
      EXPECT_TRUE(method16.values(l, 0) == exact16.values(l, 0));
    }
  }
}

TEST(ModelKv, QuantizedMethodRunsInTheLoop) {
  KVARN_REFERENCE_DIR(ref);
  auto model = Model::load(ref / "models/llama_hd64");
  // 200 tokens: KVarN g64 keeps a 64-token fp16 sink, then quantizes 64-token chunks.
  std::vector<std::int32_t> tokens(200);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 7919 + 13) % 512);
  }
  ForwardOptions all;
  all.logits = LogitsMode::kAll;
  auto run = [&](ModelKvCache& cache) {  // pseudo-decode: blocks of 8, the cache in the loop
    Matrix got(0, model->config().vocab_size);
    for (std::size_t i = 0; i < tokens.size(); i += 8) {
      auto b = model->forward(cache, std::span(tokens).subspan(i, 8), all).logits;
      got.conservativeResize(got.rows() + b.rows(), Eigen::NoChange);
      got.bottomRows(b.rows()) = b;
    }
    return got;
  };
  auto exact = model->make_cache("exact");
  auto fp16 = model->make_cache("fp16");
  auto q = model->make_cache("kvarn_k4v2_g64");
  const Matrix want = run(exact);
  const Matrix got16 = run(fp16);
  const Matrix got = run(q);
  EXPECT_TRUE(got.allFinite());
  const double e16 = rel(got16, want), e = rel(got, want);
  EXPECT_GT(e, 2 * e16) << "a 4/2-bit cache must change the logits more than fp16 rounding";
  EXPECT_LT(e, 1.0);
  // The first 64 positions see only the fp16 sink (KVarN keeps it in its rotated frame, so
  // only rounding differs) and are far closer to the fp16 cache's than the rest.
  const double e_sink = rel(got.topRows(64), got16.topRows(64));
  EXPECT_LT(e_sink, 1e-2);
  EXPECT_GT(rel(got.bottomRows(136), got16.bottomRows(136)), 3 * e_sink);
  const KvCache* c = q.method_cache(0, 0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->chunks(StreamKind::kKey).size(), 2u);  // tokens 64..191; 192..199 are the tail
  EXPECT_TRUE(q.quantized(1, 0, StreamKind::kValue, 100));
  EXPECT_FALSE(q.quantized(1, 0, StreamKind::kValue, 10));
  EXPECT_EQ(q.final_rows(0), 192);
  EXPECT_LT(q.stored_bytes(), fp16.stored_bytes());
  // Free-running decode continues through further flushes.
  auto tail = model->generate_greedy(q, std::vector<std::int32_t>{1, 2, 3}, 60);
  EXPECT_EQ(tail.size(), 60u);
  EXPECT_EQ(q.final_rows(0), 256);
  std::printf(
      "[ runner ] pseudo-decode (b=8, 200 tokens) logits rel err vs exact: "
      "kvarn_k4v2_g64 %.3e, fp16 %.3e; cache %zu vs %zu bytes\n",
      e, e16, q.stored_bytes(), fp16.stored_bytes());
}

TEST(ModelKv, ChunkAttentionModesDifferOnlyWithQuantization) {
  KVARN_REFERENCE_DIR(ref);
  auto model = Model::load(ref / "models/llama_hd64");
  std::vector<std::int32_t> tokens(140);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 37) % 500);
  ForwardOptions o;
  o.logits = LogitsMode::kAll;
  Matrix out[2];
  for (int m = 0; m < 2; ++m) {
    o.chunk_attention = m == 0 ? ChunkAttention::kExact : ChunkAttention::kCache;
    auto cache = model->make_cache("kivi_2bit");
    out[m] = model->forward(cache, tokens, o).logits;
  }
  // KIVI keys: 128 tokens quantized at once; with kCache the chunk attends to them quantized.
  EXPECT_GT(rel(out[0], out[1]), 0.0);
  for (int m = 0; m < 2; ++m) {
    o.chunk_attention = m == 0 ? ChunkAttention::kExact : ChunkAttention::kCache;
    auto cache = model->make_cache("exact");
    out[m] = model->forward(cache, tokens, o).logits;
  }
  EXPECT_TRUE(out[0] == out[1]);
}

TEST(ModelKv, CaptureHiddenStatesAndCacheContents) {
  KVARN_REFERENCE_DIR(ref);
  auto model = Model::load(ref / "models/qwen3");
  const auto& cfg = model->config();
  std::vector<std::int32_t> tokens{5, 6, 7, 8, 9};
  ForwardOptions o;
  o.hidden_states = true;
  o.attention_outputs = true;
  std::vector<LayerCapture> caps;
  o.capture = [&](const LayerCapture& c) { caps.push_back(c); };
  auto cache = model->make_cache("exact");
  const auto r = model->forward(cache, tokens, o);
  ASSERT_EQ(caps.size(), static_cast<std::size_t>(cfg.num_layers));
  ASSERT_EQ(r.hidden_states.size(), static_cast<std::size_t>(cfg.num_layers));
  ASSERT_EQ(r.attention_outputs.size(), static_cast<std::size_t>(cfg.num_layers));
  EXPECT_EQ(r.hidden_states[0].rows(), 5);
  EXPECT_EQ(r.hidden_states[0].cols(), cfg.hidden_size);
  EXPECT_EQ(r.logits.rows(), 1);
  for (const auto& c : caps) {
    ASSERT_EQ(c.q.size(), static_cast<std::size_t>(cfg.num_heads));
    ASSERT_EQ(c.k.size(), static_cast<std::size_t>(cfg.num_kv_heads));
    EXPECT_EQ(c.q[0].cols(), cfg.head_dim);
    for (int h = 0; h < cfg.num_kv_heads; ++h) {
      EXPECT_TRUE(c.k[h] == Matrix(cache.keys(c.layer, h)));  // the cache stores post-RoPE keys
      EXPECT_TRUE(c.v[h] == Matrix(cache.values(c.layer, h)));
      // Position 0 has no rotation: pre- and post-RoPE keys agree there.
      EXPECT_LE((c.k[h].row(0) - c.k_pre_rope[h].row(0)).norm(), 1e-6);
      EXPECT_GT((c.k[h].row(3) - c.k_pre_rope[h].row(3)).norm(), 1e-4);
    }
  }
}

// A copy of a reference checkpoint in a scratch folder, for corrupting.
class ModelErrors : public kvarn::testing::TempDirTest {
 protected:
  void SetUp() override {
    std::string why;
    ref_ = test::reference_dir(&why);
    if (ref_.empty()) GTEST_SKIP() << why;
    TempDirTest::SetUp();
    fs::copy(ref_ / "models/llama3", dir_);
  }
  void edit_config(const std::function<void(nlohmann::json&)>& f) {
    auto j = nlohmann::json::parse(test::read_text(dir_ / "config.json"));
    f(j);
    std::ofstream(dir_ / "config.json") << j.dump(2);
  }
  void expect_error(const std::string& needle) {
    try {
      Model::load(dir_);
      ADD_FAILURE() << "loaded, expected an error with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "wanted '" << needle << "' in: " << e.what();
    }
  }
  fs::path ref_;
};

TEST_F(ModelErrors, UnsupportedArchitecture) {
  edit_config([](auto& j) { j["architectures"] = {"GPTNeoXForCausalLM"}; });
  expect_error("architecture 'GPTNeoXForCausalLM' is not supported");
  expect_error("config.json");
}

TEST_F(ModelErrors, MissingOrCorruptConfig) {
  fs::remove(dir_ / "config.json");
  expect_error("missing config.json");
  std::ofstream(dir_ / "config.json") << "{\"architectures\": [";
  expect_error("invalid JSON");
}

TEST_F(ModelErrors, ShapeMismatch) {
  edit_config([](auto& j) { j["intermediate_size"] = 96; });
  expect_error("does not match [96, 64]");
}

TEST_F(ModelErrors, MissingTensorAndUnexpectedTensor) {
  edit_config([](auto& j) { j["num_hidden_layers"] = 3; });
  expect_error("no tensor 'model.layers.2.input_layernorm.weight'");
  edit_config([](auto& j) {
    j["num_hidden_layers"] = 2;
    j["attention_bias"] = false;
  });
  expect_error("unexpected tensor");
}

TEST_F(ModelErrors, CorruptSafetensors) {
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 100);
  expect_error("model.safetensors");
  fs::remove(dir_ / "model.safetensors");
  expect_error("no model.safetensors");
}

TEST_F(ModelErrors, BadInputs) {
  auto model = Model::load(dir_);
  auto cache = model->make_cache("exact");
  EXPECT_THROW(model->decode_step(cache, 512), Error);  // outside the vocabulary
  EXPECT_THROW(model->decode_step(cache, -1), Error);
  std::vector<std::int32_t> too_long(model->config().max_position_embeddings + 1, 3);
  EXPECT_THROW(model->prefill(cache, too_long), Error);
  EXPECT_THROW(model->make_cache("no_such_method"), Error);
  EXPECT_THROW(Model::load(dir_, LoadOptions{"tpu", "float32", 0}), Error);
  EXPECT_THROW(Model::load(dir_, LoadOptions{"cpu", "float64", 0}), Error);
  auto other = ModelKvCache::exact({1, 1, 16});
  EXPECT_THROW(model->decode_step(other, 3), Error);
}

TEST(ModelCuda, MatchesCpuWhenAvailable) {
  KVARN_REFERENCE_DIR(ref);
  KVARN_CUDA_MODEL_OR_SKIP(gpu, ref / "models/llama_hd64");
  auto cpu = Model::load(ref / "models/llama_hd64");
  std::vector<std::int32_t> tokens(200);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>(i * 31 % 512);
  for (const std::string spec : {"exact", "fp16", "kvarn_k4v2_g64", "kivi_2bit"}) {
    auto cg = gpu->make_cache(spec), cc = cpu->make_cache(spec);
    cg.set_placement(KvPlacement::kHost);  // the same host cache (GPU cache: test_gpu_cache.cpp)
    ForwardOptions all;
    all.logits = LogitsMode::kAll;
    Matrix a(0, 512), b(0, 512);
    for (std::size_t i = 0; i < tokens.size(); i += 16) {  // pseudo-decode, blocks of <= 16
      const std::size_t n = std::min<std::size_t>(16, tokens.size() - i);
      auto chunk = std::span(tokens).subspan(i, n);
      auto ra = gpu->forward(cg, chunk, all).logits;
      auto rb = cpu->forward(cc, chunk, all).logits;
      const auto rows = static_cast<Eigen::Index>(n);
      a.conservativeResize(a.rows() + rows, Eigen::NoChange);
      a.bottomRows(rows) = ra;
      b.conservativeResize(b.rows() + rows, Eigen::NoChange);
      b.bottomRows(rows) = rb;
    }
    // Quantizers can flip a rounding decision on a 1-ulp difference of the input: looser bound.
    const double e = rel(a, b);
    EXPECT_LE(e, spec.starts_with("exact") || spec == "fp16" ? 1e-4 : 2e-2) << spec;
    std::printf("[ runner ] CUDA vs CPU, %-15s pseudo-decode logits rel err %.2e\n", spec.c_str(),
                e);
  }
}

}  // namespace
}  // namespace kvarn
