// Independent model runs (prompts, windows) on several CPU threads. torch's intra-op parallelism
// splits the small per-block matrices of a decoder run across threads at a real cost in
// synchronization; whole runs on their own threads, one intra-op thread each, keep every core
// busy instead. On the CPU each run is at one intra-op thread whatever the worker count, so its
// values are computed the same way with 1 worker or many.
#ifndef KVARN_RUNNER_PARALLEL_HPP_
#define KVARN_RUNNER_PARALLEL_HPP_

#include <functional>
#include <string>

namespace kvarn {

// How independent runs are spread: `workers` threads, and whether each run is held to one torch
// intra-op thread (on the CPU) or leaves torch's threads as they are (on a GPU).
struct RunPlan {
  int workers = 1;
  bool single_thread_runs = false;
};

// The plan for `items` runs on `device` ("cpu", "cuda", "cuda:N") with a budget of `threads` CPU
// threads (0: torch's intra-op default, which follows OMP_NUM_THREADS). CPU: min(items, threads)
// workers (at least 1), one intra-op thread each; a GPU: one run at a time.
RunPlan plan_runs(int items, int threads, const std::string& device);

// fn(i) for every i in [0, items), handed out in increasing order to the plan's workers; torch's
// intra-op thread count is restored afterwards. When items fail, the exception of the lowest
// failing index is rethrown once every worker has stopped (no item starts after a failure).
void for_each_run(int items, const RunPlan& plan, const std::function<void(int)>& fn);

}  // namespace kvarn

#endif  // KVARN_RUNNER_PARALLEL_HPP_
