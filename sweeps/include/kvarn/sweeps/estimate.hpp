// Rough cost model of a resolved sweep for `kvarn-eval validate`: token-slabs x per-token
// constants per metric family, the capture step and accumulation scaled by weight bytes.
#ifndef KVARN_SWEEPS_ESTIMATE_HPP_
#define KVARN_SWEEPS_ESTIMATE_HPP_

#include <cstdint>

#include "kvarn/sweeps/config.hpp"

namespace kvarn {

struct SweepEstimate {
  std::int64_t slabs = 0;   // (tiles, sequence, layer, KV head) per case
  std::int64_t tokens = 0;  // tokens over those slabs, per case
  double seconds = 0;       // whole sweep, one core (the capture step included)
  double bytes = 0;         // run directory (the capture file included)
  double capture_seconds = 0, capture_bytes = 0;  // the data.capture step alone (0: none)
};
SweepEstimate estimate_sweep(const SweepConfig& cfg);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_ESTIMATE_HPP_
