// The check of a real checkpoint (the fixture, SmolLM2) against the transformers reference that
// make_reference.py writes as <name>.json + <name>_logits.safetensors: fp32 logits of prompt +
// greedy continuation, and 128 greedy tokens, on CPU and (when a device exists) on CUDA.
#ifndef KVARN_TESTS_EVAL_RUNNER_REAL_MODEL_CHECK_HPP_
#define KVARN_TESTS_EVAL_RUNNER_REAL_MODEL_CHECK_HPP_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cuda_load.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/runner/runner.hpp"
#include "kvarn/runner/safetensors.hpp"
#include "runner_test_util.hpp"

namespace kvarn::test {

constexpr double kRealMaxRelError = 1e-4;
constexpr int kRealGreedySteps = 128;
// A greedy step whose transformers top-2 logit margin is below this is a near-tie that fp32
// rounding may legitimately flip; the reference prompts are chosen to have none.
constexpr double kMinTop2Margin = 1e-3;

// Index of the first difference of two token lists, or -1 when equal.
inline long first_difference(const std::vector<std::int32_t>& a,
                             const std::vector<std::int32_t>& b) {
  const auto n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<long>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<long>(n);
}

inline void check_greedy(const std::string& where, const std::vector<std::int32_t>& got,
                         const std::vector<std::int32_t>& want,
                         const std::vector<double>& margins) {
  const long d = first_difference(got, want);
  EXPECT_EQ(d, -1) << where << ": greedy token " << d << " differs from transformers ("
                   << (d >= 0 && d < static_cast<long>(got.size()) ? got[d] : -1) << " vs "
                   << (d >= 0 && d < static_cast<long>(want.size()) ? want[d] : -1)
                   << "; transformers' top-2 margin there "
                   << (d >= 0 && d < static_cast<long>(margins.size()) ? margins[d] : 0.0) << ")";
}

inline void check_real_model(const std::string& name, const std::filesystem::path& model_dir,
                             const std::filesystem::path& ref) {
  const auto json_file = ref / (name + ".json");
  ASSERT_TRUE(std::filesystem::exists(json_file))
      << json_file << " missing: make_reference.py did not get --" << name;
  const auto j = nlohmann::json::parse(read_text(json_file));
  const auto prompt = j["tokens"].get<std::vector<std::int32_t>>();
  const auto want_greedy = j["greedy"].get<std::vector<std::int32_t>>();
  const auto margins = j["margins"].get<std::vector<double>>();
  ASSERT_EQ(want_greedy.size(), static_cast<std::size_t>(kRealGreedySteps));
  ASSERT_EQ(margins.size(), static_cast<std::size_t>(kRealGreedySteps));

  // A near-tie in the reference is reported as such, not as a runner bug.
  const auto min_it = std::min_element(margins.begin(), margins.end());
  EXPECT_GT(*min_it, kMinTop2Margin)
      << name << ": transformers' greedy step " << (min_it - margins.begin())
      << " is a near-tie (top-2 logit margin " << *min_it
      << "); choose a prompt without near-ties in make_reference.py (docs/runner.md)";

  // One intra-op thread: decode steps are small matmuls; on 2 shared cores torch's default (2
  // threads) made this test 5-10x slower (SmolLM2: 164 s vs 30 s wall).
  auto runner = Runner::open(model_dir, LoadOptions{"cpu", "float32", 1});
  if (runner.has_tokenizer()) {
    EXPECT_EQ(runner.encode(j["prompt"].get<std::string>()), prompt) << name;
  }
  SafetensorsFile f(ref / (name + "_logits.safetensors"));
  const auto& info = f.info("logits");
  std::vector<std::int32_t> sequence = prompt;
  sequence.insert(sequence.end(), want_greedy.begin(), want_greedy.end());
  ASSERT_EQ(info.shape.size(), 2u);
  ASSERT_EQ(info.shape[0], static_cast<std::int64_t>(sequence.size()));
  ASSERT_EQ(info.shape[1], runner.model().config().vocab_size);
  ASSERT_EQ(info.end - info.begin, sequence.size() * info.shape[1] * sizeof(float));  // F32
  Matrix want(info.shape[0], info.shape[1]);
  std::memcpy(want.data(), f.data(info), info.end - info.begin);

  // Prefill of prompt + continuation: every position's logits.
  ForwardOptions all;
  all.logits = LogitsMode::kAll;
  auto cache = runner.model().make_cache("exact");
  const auto got = runner.model().forward(cache, sequence, all).logits;
  ASSERT_EQ(got.rows(), want.rows());
  ASSERT_EQ(got.cols(), want.cols());
  const double e = relative_error(got.data(), want.data(), got.size());
  EXPECT_LE(e, kRealMaxRelError) << name;

  // 128 greedy tokens through the decode path (prefill of the prompt, then one token a step).
  auto gen_cache = runner.model().make_cache("exact");
  const auto greedy = runner.model().generate_greedy(gen_cache, prompt, kRealGreedySteps);
  check_greedy(name, greedy, want_greedy, margins);
  std::printf(
      "[ runner ] %s: %zu-token prompt + 128 greedy, logits rel err %.2e; greedy 128/128 %s "
      "(min top-2 margin %.3g)\n",
      name.c_str(), prompt.size(), e, greedy == want_greedy ? "equal" : "DIFFER", *min_it);
  if (runner.has_tokenizer()) {
    std::printf("[ runner ] %s greedy text: %s\n", name.c_str(),
                nlohmann::json(runner.decode(greedy)).dump().c_str());
  }

  // The same on CUDA when a device exists (fp32, no TF32); any other load error fails.
  std::string no_device;
  const auto gpu = load_on_cuda(model_dir, &no_device);
  if (gpu == nullptr) {
    if (!no_device.empty())
      std::printf("[ runner ] %s: CUDA part not run: %s\n", name.c_str(), no_device.c_str());
    return;
  }
  auto gc = gpu->make_cache("exact");
  const auto got_gpu = gpu->forward(gc, sequence, all).logits;
  const double e_gpu = relative_error(got_gpu.data(), want.data(), got_gpu.size());
  EXPECT_LE(e_gpu, kRealMaxRelError) << name << " on CUDA";
  auto gg = gpu->make_cache("exact");
  const auto greedy_gpu = gpu->generate_greedy(gg, prompt, kRealGreedySteps);
  check_greedy(name + " on CUDA", greedy_gpu, want_greedy, margins);
  std::printf("[ runner ] %s on %s: logits rel err %.2e, greedy 128/128 %s\n", name.c_str(),
              gpu->device().c_str(), e_gpu, greedy_gpu == want_greedy ? "equal" : "DIFFER");
}

}  // namespace kvarn::test

#endif  // KVARN_TESTS_EVAL_RUNNER_REAL_MODEL_CHECK_HPP_
