// `retrieval:` with enabled: true (passkey and induction copy, the method in the model loop).
// Models, the filler file and every prompt length are checked here, so nothing runs on a config
// that would fail half-way.
#include <algorithm>
#include <cmath>
#include <set>

#include "config_parse.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_steps.hpp"

namespace kvarn::config_detail {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSection = "retrieval";
constexpr const char* kPasskey = "retrieval.passkey";
constexpr const char* kInduction = "retrieval.induction";

// A list of ints, each in the key's range, non-empty and without repeats.
std::vector<int> get_int_list(const Ctx& c, const YAML::Node& n, const std::string& key,
                              const ConfigKey& spec) {
  if (!n.IsSequence() || n.size() == 0) c.fail_at(n, key, "expected a non-empty list of integers");
  std::vector<int> out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const int v =
        static_cast<int>(get_int(c, n[i], key + "." + std::to_string(i), spec.min, spec.max));
    if (std::find(out.begin(), out.end(), v) != out.end())
      c.fail_at(n[i], key + "." + std::to_string(i), std::to_string(v) + " given twice");
    out.push_back(v);
  }
  return out;
}

// A checkpoint directory the runner can load.
RetrievalModel load_model(const Ctx& c, const YAML::Node& n, const std::string& key,
                          const fs::path& config_path, bool need_tokenizer) {
  if (!present(n)) c.fail_at(n, key, "missing: a checkpoint directory");
  return read_checkpoint(c, n, key, config_path,
                         need_tokenizer ? "the passkey prompt is text" : "");
}

void read_string(const Ctx& c, const YAML::Node& map, const std::string& path, const char* name,
                 std::string& out) {
  if (map[name].IsDefined()) out = get_string(c, map[name], path + "." + name);
}

void parse_passkey(const Ctx& c, const YAML::Node& n, const fs::path& config_path,
                   PasskeySettings& p) {
  require_map(c, n, kPasskey);
  check_keys(c, n, kPasskey, config_section_keys(kPasskey));
  p.enabled = !n["enabled"].IsDefined() || get_bool(c, n["enabled"], "retrieval.passkey.enabled");
  if (!p.enabled) return;
  p.model = load_model(c, n["model"], "retrieval.passkey.model", config_path, true);
  if (!present(n["filler"])) c.fail_at(n, "retrieval.passkey.filler", "missing: a text file");
  p.filler = get_string(c, n["filler"], "retrieval.passkey.filler");
  p.filler_resolved = resolve_input_path(p.filler, config_path);
  if (p.filler_resolved.empty()) {
    c.fail_at(n["filler"], "retrieval.passkey.filler", "file not found: " + p.filler);
  }
  if (n["lengths"].IsDefined()) {
    p.lengths =
        get_int_list(c, n["lengths"], "retrieval.passkey.lengths", config_key(kPasskey, "lengths"));
  }
  if (const YAML::Node d = n["depths"]; d.IsDefined()) {
    if (!d.IsSequence() || d.size() == 0)
      c.fail_at(d, "retrieval.passkey.depths", "expected a non-empty list of numbers in [0, 1]");
    p.depths.clear();
    for (std::size_t i = 0; i < d.size(); ++i) {
      const std::string k = "retrieval.passkey.depths." + std::to_string(i);
      const double v = get_double(c, d[i], k);
      if (!(v >= 0 && v <= 1)) c.fail_at(d[i], k, "must be in [0, 1]");
      if (std::find(p.depths.begin(), p.depths.end(), v) != p.depths.end())
        c.fail_at(d[i], k, "given twice");
      p.depths.push_back(v);
    }
  }
  read_int(c, n, kPasskey, config_key(kPasskey, "trials"), p.trials);
  read_int(c, n, kPasskey, config_key(kPasskey, "digits"), p.digits);
  read_int(c, n, kPasskey, config_key(kPasskey, "decode_steps"), p.decode_steps);
  // The answer's tokens are fed back at positions length .. length + decode_steps - 2.
  for (std::size_t i = 0; i < p.lengths.size(); ++i) {
    const long long last = static_cast<long long>(p.lengths[i]) + p.decode_steps - 1;
    if (last > p.model.max_position_embeddings) {
      c.fail_at(n["lengths"].IsDefined() ? n["lengths"] : n, "retrieval.passkey.lengths",
                std::to_string(p.lengths[i]) + " tokens + " + std::to_string(p.decode_steps) +
                    " decode steps need " + std::to_string(last) + " positions, more than " +
                    p.model.name + "'s max_position_embeddings " +
                    std::to_string(p.model.max_position_embeddings));
    }
  }
  if (n["chat"].IsDefined()) p.chat = get_bool(c, n["chat"], "retrieval.passkey.chat");
  read_string(c, n, kPasskey, "intro", p.intro);
  read_string(c, n, kPasskey, "needle", p.needle);
  read_string(c, n, kPasskey, "question", p.question);
  read_string(c, n, kPasskey, "answer_prefix", p.answer_prefix);
  if (p.needle.find("{key}") == std::string::npos) {
    c.fail_at(n["needle"], "retrieval.passkey.needle", "must contain {key} (the passkey)");
  }
}

void parse_induction(const Ctx& c, const YAML::Node& n, const fs::path& config_path,
                     InductionSettings& ind) {
  require_map(c, n, kInduction);
  check_keys(c, n, kInduction, config_section_keys(kInduction));
  ind.enabled =
      !n["enabled"].IsDefined() || get_bool(c, n["enabled"], "retrieval.induction.enabled");
  if (!ind.enabled) return;
  ind.model = load_model(c, n["model"], "retrieval.induction.model", config_path, false);
  if (n["spans"].IsDefined()) {
    ind.spans =
        get_int_list(c, n["spans"], "retrieval.induction.spans", config_key(kInduction, "spans"));
  }
  if (n["distances"].IsDefined()) {
    ind.distances = get_int_list(c, n["distances"], "retrieval.induction.distances",
                                 config_key(kInduction, "distances"));
  }
  read_int(c, n, kInduction, config_key(kInduction, "prefix"), ind.prefix);
  read_int(c, n, kInduction, config_key(kInduction, "trials"), ind.trials);
  read_int(c, n, kInduction, config_key(kInduction, "occurrences"), ind.occurrences);
  read_int(c, n, kInduction, config_key(kInduction, "token_lo"), ind.token_lo);
  read_int(c, n, kInduction, config_key(kInduction, "token_hi"), ind.token_hi);
  if (ind.token_hi > ind.model.vocab_size) {
    c.fail_at(n["token_hi"], "retrieval.induction.token_hi",
              std::to_string(ind.token_hi) + " exceeds " + ind.model.name + "'s vocab_size " +
                  std::to_string(ind.model.vocab_size));
  }
  if (ind.token_hi == 0) ind.token_hi = ind.model.vocab_size;
  if (ind.token_lo >= ind.token_hi - 1) {
    c.fail_at(n["token_lo"].IsDefined() ? n["token_lo"] : n, "retrieval.induction.token_lo",
              "leaves fewer than 2 token ids in [token_lo, token_hi) = [" +
                  std::to_string(ind.token_lo) + ", " + std::to_string(ind.token_hi) + ")");
  }
  const std::int64_t longest =
      induction_tokens(ind, *std::max_element(ind.spans.begin(), ind.spans.end()),
                       *std::max_element(ind.distances.begin(), ind.distances.end()));
  if (longest > ind.model.max_position_embeddings) {
    c.fail_at(n, "retrieval.induction",
              "prefix + occurrences * span + (occurrences - 1) * distance = " +
                  std::to_string(longest) + " exceeds " + ind.model.name +
                  "'s max_position_embeddings " + std::to_string(ind.model.max_position_embeddings));
  }
}

}  // namespace

void parse_retrieval(const Ctx& c, const YAML::Node& n, const fs::path& config_path,
                     SweepConfig& cfg) {
  RetrievalSettings& r = cfg.retrieval;
  if (!runner_steps().available()) {
    r = RetrievalSettings{};
    cfg.notices.push_back(cfg.name +
                          ": retrieval skipped: this kvarn-eval was built without the libtorch "
                          "model runner (scripts/install_deps.sh installs torch; rebuild)");
    return;
  }
  read_int(c, n, kSection, config_key(kSection, "block"), r.block);
  read_int(c, n, kSection, config_key(kSection, "threads"), r.threads);
  read_int(c, n, kSection, config_key(kSection, "seed"), r.seed);
  if (n["current_token"].IsDefined()) {
    r.current_token = get_string(c, n["current_token"], "retrieval.current_token");
    if (r.current_token != "exact" && r.current_token != "quantized")
      c.fail_at(n["current_token"], "retrieval.current_token", "expected exact or quantized");
  }
  if (n["device"].IsDefined()) {
    r.device = get_string(c, n["device"], "retrieval.device");
    const bool ok = r.device == "cpu" || r.device == "cuda" || r.device.rfind("cuda:", 0) == 0;
    if (!ok) c.fail_at(n["device"], "retrieval.device", "expected cpu, cuda or cuda:N");
  }
  if (present(n["passkey"])) parse_passkey(c, n["passkey"], config_path, r.passkey);
  if (present(n["induction"])) parse_induction(c, n["induction"], config_path, r.induction);
  if (!r.passkey.enabled && !r.induction.enabled) {
    c.fail_at(n, "retrieval", "enabled, but neither passkey nor induction is configured");
  }
}

json retrieval_json(const RetrievalSettings& r) {
  if (!r.enabled) return {{"enabled", false}};
  auto model = [](const RetrievalModel& m) {
    return json{{"path", m.path}, {"name", m.name}, {"fingerprint", m.fingerprint}};
  };
  json out = {{"enabled", true},
              {"block", r.block},
              {"current_token", r.current_token},
              {"seed", r.seed},
              {"device", r.device}};
  const PasskeySettings& p = r.passkey;
  if (p.enabled) {
    out["passkey"] = {{"model", model(p.model)},
                      {"filler", p.filler},
                      {"filler_fingerprint", file_fingerprint(p.filler_resolved)},
                      {"lengths", p.lengths},
                      {"depths", p.depths},
                      {"trials", p.trials},
                      {"digits", p.digits},
                      {"decode_steps", p.decode_steps},
                      {"chat", p.chat},
                      {"intro", p.intro},
                      {"needle", p.needle},
                      {"question", p.question},
                      {"answer_prefix", p.answer_prefix}};
  }
  const InductionSettings& i = r.induction;
  if (i.enabled) {
    out["induction"] = {{"model", model(i.model)},      {"spans", i.spans},
                        {"distances", i.distances},     {"prefix", i.prefix},
                        {"trials", i.trials},           {"token_lo", i.token_lo},
                        {"occurrences", i.occurrences}, {"token_hi", i.token_hi}};
  }
  return out;
}

}  // namespace kvarn::config_detail
