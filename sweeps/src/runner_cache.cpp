#include "runner_cache.hpp"

#include <map>

namespace kvarn {

const Runner& shared_runner(const std::filesystem::path& checkpoint, const std::string& device,
                            int threads) {
  static std::map<std::string, Runner> runners;
  const std::string key = checkpoint.string() + "|" + device + "|" + std::to_string(threads);
  auto it = runners.find(key);
  if (it == runners.end()) {
    LoadOptions lo;
    lo.device = device;
    lo.num_threads = threads;
    it = runners.emplace(key, Runner::open(checkpoint, lo)).first;
  }
  return it->second;
}

}  // namespace kvarn
