// Independent model runs on several threads (kvarn/runner/parallel.hpp): every item runs once,
// the values do not depend on the worker count, failures surface deterministically.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvarn/runner/accumulation.hpp"
#include "kvarn/runner/model.hpp"
#include "kvarn/runner/parallel.hpp"
#include "runner_test_util.hpp"

namespace kvarn {
namespace {

TEST(ForEachRun, EveryItemRunsOnceWhateverTheWorkers) {
  for (int workers : {1, 2, 3, 8}) {
    std::vector<std::atomic<int>> seen(17);
    for_each_run(17, RunPlan{workers, true}, [&](int i) { ++seen[static_cast<std::size_t>(i)]; });
    for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i].load(), 1) << i;
  }
  for_each_run(0, RunPlan{2, true}, [](int) { FAIL() << "no item to run"; });
}

TEST(ForEachRun, TheLowestFailingItemIsRethrown) {
  for (int workers : {1, 2, 4}) {
    try {
      for_each_run(8, RunPlan{workers, true}, [](int i) {
        if (i == 3 || i == 5) throw std::runtime_error("item " + std::to_string(i));
      });
      FAIL() << "expected a failure, " << workers << " workers";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "item 3") << workers << " workers";
    }
  }
}

TEST(ForEachRun, PlanFollowsTheBudgetAndTheDevice) {
  const RunPlan cpu = plan_runs(16, 2, "cpu");
  EXPECT_EQ(cpu.workers, 2);
  EXPECT_TRUE(cpu.single_thread_runs);
  EXPECT_EQ(plan_runs(1, 8, "cpu").workers, 1);
  EXPECT_TRUE(plan_runs(1, 8, "cpu").single_thread_runs) << "one CPU run is still one thread";
  EXPECT_EQ(plan_runs(0, 4, "cpu").workers, 1);
  EXPECT_GE(plan_runs(16, 0, "cpu").workers, 1);
  for (const char* gpu : {"cuda", "cuda:1"}) {
    const RunPlan g = plan_runs(16, 8, gpu);
    EXPECT_EQ(g.workers, 1) << gpu;
    EXPECT_FALSE(g.single_thread_runs) << gpu << ": torch's threads are left as they are";
  }
}

// Accumulation runs of four prompts on 1, 2 and 3 workers give the same arrays, value for value.
TEST(ForEachRun, AccumulationRunsAreIdenticalOnAnyWorkerCount) {
  std::string why;
  const auto dir = test::reference_dir(&why);
  if (dir.empty()) GTEST_SKIP() << why;
  const auto model = Model::load(dir / "models" / "llama_hd64");
  AccumulationOptions o;
  o.block = 8;
  o.context = 40;
  o.decode_steps = 6;
  std::vector<AccumulationReference> refs(4);
  for (int p = 0; p < 4; ++p) {
    std::vector<std::int32_t> prompt(10 + p);
    std::iota(prompt.begin(), prompt.end(), 3 + 5 * p);
    refs[static_cast<std::size_t>(p)] = accumulation_reference(*model, prompt, o);
  }
  auto run_all = [&](int workers) {
    std::vector<std::string> out(refs.size());
    for_each_run(4, RunPlan{workers, true}, [&](int p) {
      const auto i = static_cast<std::size_t>(p);
      out[i] =
          to_json(run_accumulation(*model, refs[i], "kivi:bits=2,group=8,residual=8", o)).dump();
    });
    return out;
  };
  const std::vector<std::string> one = run_all(1);
  EXPECT_EQ(run_all(2), one);
  EXPECT_EQ(run_all(3), one);
}

}  // namespace
}  // namespace kvarn
