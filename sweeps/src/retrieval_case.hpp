// The sweep engine's part of retrieval: passkey and induction copy (kvarn/runner/retrieval.hpp)
// for one case, as summary rows and a record block (docs/results.md, "Retrieval"). Internal to
// kvarn_sweeps; compiled only with the runner.
#ifndef KVARN_SWEEPS_SRC_RETRIEVAL_CASE_HPP_
#define KVARN_SWEEPS_SRC_RETRIEVAL_CASE_HPP_

#include <nlohmann/json.hpp>

#include "kvarn/sweeps/config.hpp"

namespace kvarn {

struct RetrievalCase {
  nlohmann::json record = nlohmann::json::object();  // cases/<id>.json "retrieval"
  nlohmann::json rows = nlohmann::json::array();     // tidy summary rows
};

// Built only with the runner; the engine reaches it through RunnerSteps (runner_steps.hpp).
RetrievalCase run_retrieval_case(const SweepConfig& cfg, const CaseSpec& cs);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_SRC_RETRIEVAL_CASE_HPP_
