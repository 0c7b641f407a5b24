// `data.capture` in the engine: make or reuse <run_dir>/capture_file(i) (capture_step.hpp).
#include "capture_step.hpp"

#include <chrono>

#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_steps.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// "" when `file` is a readable capture of the spec hashed `hash`, else what is wrong with it.
std::string capture_problem(const fs::path& file, const std::string& hash) {
  try {
    const TileReader r(file);
    const json p = json::parse(r.info().provenance, nullptr, false);
    if (p.is_discarded() || !p.is_object() || !p.contains("sweep") || !p["sweep"].is_object() ||
        !p["sweep"].contains("spec_hash")) {
      return "records no data.capture spec (not made by a sweep)";
    }
    const std::string got = p["sweep"]["spec_hash"].is_string()
                                ? p["sweep"]["spec_hash"].get<std::string>()
                                : std::string("?");
    if (got != hash) {
      return "was captured with another spec (hash " + got.substr(0, 12) + ", this config " +
             hash.substr(0, 12) + ")";
    }
  } catch (const Error& e) {
    return std::string("is unreadable (") + e.what() + ")";
  }
  return "";
}

}  // namespace

CaptureStep prepare_capture(const SweepConfig& cfg, std::size_t index, const fs::path& run_dir,
                            bool needed, bool cases_finished, const std::string& command,
                            std::FILE* log) {
  KVARN_CHECK(index < cfg.data.captures.size(), "prepare_capture: the config has no capture ",
              index);
  const CaptureSpec& cap = cfg.data.captures[index];
  const std::string rel = capture_file(index);
  const fs::path file = run_dir / rel;
  CaptureStep step;
  step.provenance = {
      {"file", rel}, {"key", cap.key}, {"spec_hash", cap.hash}, {"spec", cap.resolved}};
  const bool exists = fs::exists(file);
  std::string problem = exists ? capture_problem(file, cap.hash) : "does not exist";
  if (!problem.empty()) {
    if (!needed) {  // e.g. every case finished and the capture was deleted to save disk
      step.provenance["status"] = "not made (no case to compute)";
      return step;
    }
    // Finished cases were computed from the capture that was there: a new one could differ.
    KVARN_CHECK(!cases_finished, file.string(), " ", problem,
                ", but finished cases of this run were computed from the capture made for it; "
                "start a new run directory (--fresh) instead of mixing captures");
    if (exists)
      std::fprintf(log, "%s %s: capturing again\n", file.string().c_str(), problem.c_str());
    std::fprintf(log, "%s: capturing %s from %s into %s (%zu prompt(s), %d generated tokens)\n",
                 cfg.name.c_str(), cap.key.c_str(), cap.model.c_str(), file.string().c_str(),
                 cap.sequence_tokens.size(), cap.generate);
    std::fflush(log);
    fs::create_directories(file.parent_path());
    const auto t0 = std::chrono::steady_clock::now();
    runner_steps().capture(cfg, cap, file, exists, command, log);
    step.provenance["status"] = "captured";
    step.provenance["seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    problem = capture_problem(file, cap.hash);
    KVARN_CHECK(problem.empty(), file.string(), " ", problem, " right after the capture");
  } else {
    std::fprintf(log, "%s: reusing %s (a capture of %s, spec hash %s)\n", cfg.name.c_str(),
                 file.string().c_str(), cap.key.c_str(), cap.hash.substr(0, 12).c_str());
    step.provenance["status"] = "reused";
  }
  const TileReader r(file);
  step.available = true;
  step.tiles.path = rel;
  step.tiles.resolved = file;
  step.tiles.name = cap.name;
  step.tiles.head_dim = r.info().head_dim;
  step.tiles.fingerprint = file_fingerprint(file);
  std::vector<int> tokens;
  for (int s = 0; s < r.num_sequences(); ++s) tokens.push_back(r.sequence(s).num_tokens);
  const json made = json::parse(r.info().provenance, nullptr, false);
  step.provenance["fingerprint"] = step.tiles.fingerprint;
  step.provenance["bytes"] = fs::file_size(file);
  step.provenance["sequences"] = r.num_sequences();
  step.provenance["num_tokens"] = tokens;
  step.provenance["created"] = made.value("created", json(nullptr));
  step.provenance["checks"] = made.value("checks", json(nullptr));
  step.provenance["generation"] = made.value("generation", json(nullptr));
  return step;
}

}  // namespace kvarn
