#include "kvarn/runner/parallel.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "kvarn/data/error.hpp"

namespace kvarn {

RunPlan plan_runs(int items, int threads, const std::string& device) {
  if (device != "cpu") return {};
  const int budget = threads > 0 ? threads : at::get_num_threads();
  return {std::max(1, std::min(items, budget)), true};
}

void for_each_run(int items, const RunPlan& plan, const std::function<void(int)>& fn) {
  KVARN_CHECK(items >= 0 && plan.workers >= 1, "for_each_run: ", items, " items on ", plan.workers,
              " workers");
  const int saved = at::get_num_threads();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(items));
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    // This thread's OpenMP / MKL count and torch's global setting.
    if (plan.single_thread_runs) at::set_num_threads(1);
    for (int i = next++; i < items && !failed; i = next++) {
      try {
        fn(i);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
        failed = true;
      }
    }
  };
  const int n = std::min(plan.workers, std::max(items, 1));
  std::vector<std::thread> pool;
  for (int w = 1; w < n; ++w) pool.emplace_back(work);
  work();  // the calling thread is a worker too
  for (std::thread& t : pool) t.join();
  if (plan.single_thread_runs) at::set_num_threads(saved);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kvarn
