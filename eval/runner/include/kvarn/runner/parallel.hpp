// Independent model runs (prompts, windows) on several CPU threads. torch's intra-op parallelism
// splits the small per-block matrices of a decoder run across threads at a real cost in
// synchronization; whole runs on their own threads, one intra-op thread each, keep every core
// busy instead. Each item runs at one intra-op thread whatever the worker count, so its values
// are computed the same way with 1 worker or many.
#ifndef KVARN_RUNNER_PARALLEL_HPP_
#define KVARN_RUNNER_PARALLEL_HPP_

#include <functional>

namespace kvarn {

// Workers for `items` independent runs on a budget of `threads` CPU threads (0: torch's intra-op
// default, which follows OMP_NUM_THREADS): min(items, threads), at least 1.
int run_workers(int items, int threads);

// fn(i) for every i in [0, items), handed out in increasing order to `workers` threads, each
// running torch at one intra-op thread; torch's intra-op thread count is restored afterwards. When
// items fail, the exception of the lowest failing index is rethrown once every worker has
// stopped (no item starts after a failure).
void for_each_run(int items, int workers, const std::function<void(int)>& fn);

}  // namespace kvarn

#endif  // KVARN_RUNNER_PARALLEL_HPP_
