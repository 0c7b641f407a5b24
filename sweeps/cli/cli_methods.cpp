// `kvarn-eval methods`: the registry's presets (plus each family's default instance when no
// preset names it) with their exact storage: per-token steady state from Method::accounting and,
// at a given context length, the exact bytes from Method::sequence_bytes (fp16 sink, tail and
// residual windows included) and the model-level effective bits over --layers layers (fp16
// boundary layers included; kvarn/core/effective_bits.hpp).
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {

struct MethodsOptions {
  int head_dim = 128;
  int group = 0;
  int context = 4096;
  int layers = 1;
  bool json = false;
};

struct Row {
  std::string label;  // what the user would type
  std::string spec;
  std::unique_ptr<Method> method;
  std::string error;  // build or head_dim error; the row is then reported, not fatal
};

// Presets first, then each family's default when no preset already stands for it, then (with
// --group) each family that has a group parameter, at that group.
std::vector<Row> collect_rows(const MethodsOptions& o) {
  const Registry& reg = Registry::instance();
  std::vector<Row> rows;
  std::set<std::string> seen;
  auto add = [&](const std::string& label, const std::string& spec) {
    Row r;
    r.label = label;
    r.spec = spec;
    try {
      r.method = reg.make(spec);
      r.spec = r.method->spec();
      if (!seen.insert(r.spec).second) return;
    } catch (const Error& e) {
      r.error = e.what();
    }
    rows.push_back(std::move(r));
  };
  for (const auto& p : reg.presets()) add(p.name, p.spec);
  for (const auto& f : reg.families()) {
    try {
      auto m = reg.make(f.family);
      if (seen.count(m->spec())) continue;
      add(m->name(), f.family);
    } catch (const Error&) {
      // A family without a parameter-free default is reachable through its presets only.
    }
  }
  if (o.group > 0) {
    for (const auto& f : reg.families()) {
      for (const char* key : {"g", "group"}) {
        bool has = false;
        for (const auto& k : f.keys) has = has || k == key;
        if (!has) continue;
        const std::string spec = f.family + ":" + key + "=" + std::to_string(o.group);
        add(spec, spec);
      }
    }
  }
  return rows;
}

nlohmann::json policy_json(const StreamPolicy& p) {
  return {{"sink", p.sink}, {"chunk", p.chunk}, {"keep_recent", p.keep_recent}};
}

void run_methods(const MethodsOptions& o) {
  KVARN_CHECK(o.head_dim > 0, "--head-dim must be positive, got ", o.head_dim);
  KVARN_CHECK(o.context > 0, "--context must be positive, got ", o.context);
  KVARN_CHECK(o.layers > 0 && o.layers <= 4096, "--layers must be in [1, 4096], got ", o.layers);
  const std::vector<Row> rows = collect_rows(o);
  const double fp16_bytes = 4.0 * o.head_dim * o.context;  // K + V, 2 bytes each
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json j = {{"name", r.label},
                        {"spec", r.spec},
                        {"head_dim", o.head_dim},
                        {"context", o.context},
                        {"layers", o.layers}};
    if (r.error.empty()) {
      j["family"] = r.method->family();
      j["description"] = r.method->description();
      try {
        const Accounting a = r.method->accounting(o.head_dim);
        const double seq = static_cast<double>(r.method->sequence_bytes(o.context, o.head_dim));
        j["key_code_bits"] = a.key_code_bits;
        j["value_code_bits"] = a.value_code_bits;
        j["key_bytes_per_token"] = a.key_bytes_per_token;
        j["value_bytes_per_token"] = a.value_bytes_per_token;
        j["bytes_per_token"] = a.bytes_per_token();
        j["bits_per_element"] = a.bits_per_element();
        j["capacity_vs_fp16"] = a.capacity_vs_fp16();
        j["key_policy"] = policy_json(a.key_policy);
        j["value_policy"] = policy_json(a.value_policy);
        j["sequence_bytes"] = static_cast<std::uint64_t>(seq);
        j["bits_per_element_at_context"] = seq * 8.0 / (2.0 * o.head_dim * o.context);
        j["capacity_vs_fp16_at_context"] = fp16_bytes / seq;
        j["effective_bits"] = model_effective_bits(*r.method, o.head_dim, o.context, o.layers);
      } catch (const Error& e) {
        j["error"] = e.what();
      }
    } else {
      j["error"] = r.error;
    }
    out.push_back(std::move(j));
  }
  if (o.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf(
      "Per KV head, head_dim %d; \"@T\" columns at context %d tokens (exact, fp16 sink/\n"
      "tail/residual windows included). B/tok = K+V bytes per token incl. metadata.\n"
      "eff@T,L = effective bits/element of a %d-layer model at T (fp16 boundary layers\n"
      "included); bits/el = steady state of a quantized layer.\n\n",
      o.head_dim, o.context, o.layers);
  std::printf("%-24s %6s %6s %8s %8s %12s %8s %7s %8s  %s\n", "method", "K bits", "V bits", "B/tok",
              "bits/el", "bytes@T", "bits@T", "cap@T", "eff@T,L", "spec");
  for (const auto& j : out) {
    const std::string name = j["name"].get<std::string>();
    if (j.contains("error")) {
      std::printf("%-24s unavailable: %s\n", name.c_str(), j["error"].get<std::string>().c_str());
      continue;
    }
    std::printf("%-24s %6.3g %6.3g %8.2f %8.3f %12llu %8.3f %6.2fx %8.3f  %s\n", name.c_str(),
                j["key_code_bits"].get<double>(), j["value_code_bits"].get<double>(),
                j["bytes_per_token"].get<double>(), j["bits_per_element"].get<double>(),
                static_cast<unsigned long long>(j["sequence_bytes"].get<std::uint64_t>()),
                j["bits_per_element_at_context"].get<double>(),
                j["capacity_vs_fp16_at_context"].get<double>(), j["effective_bits"].get<double>(),
                j["spec"].get<std::string>().c_str());
  }
}

}  // namespace

void add_methods_command(CLI::App& app) {
  auto opts = std::make_shared<MethodsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "methods", "List every registered method with its exact storage accounting");
  cmd->add_option("--head-dim", opts->head_dim, "Head dimension D (default 128)");
  cmd->add_option("--context", opts->context,
                  "Context length T for the exact per-sequence columns (default 4096)");
  cmd->add_option("--layers", opts->layers,
                  "Layers L of the model for the model-level effective bits (eff@T,L: fp16 "
                  "boundary layers averaged over all L layers; default 1)");
  cmd->add_option("--group", opts->group,
                  "Also list each family that has a group parameter (g= or group=) at this "
                  "group size, other parameters at their defaults; presets are unaffected");
  cmd->add_flag("--json", opts->json, "Print a JSON array of objects instead of a table");
  cmd->callback([opts] { run_methods(*opts); });
}

}  // namespace kvarn
