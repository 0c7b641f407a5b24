// Error accumulation in the sweep engine: eval's protocols (kvarn/runner/accumulation.hpp) per
// case, model and prompt; the fp16 references and the loaded models are kept for the whole process,
// so a sweep computes each reference once however many cases use it.
#include "accumulation_case.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/eval/metrics.hpp"
#include "kvarn/runner/accumulation.hpp"
#include "kvarn/runner/parallel.hpp"
#include "kvarn/runner/runner.hpp"
#include "kvarn/sweeps/unit_stats.hpp"
#include "runner_cache.hpp"

namespace kvarn {

struct AccumulationCaseData {
  struct Model {
    std::string name;
    int num_layers = 0;
    std::vector<AccumulationResult> prompts;                             // empty when skipped
    std::vector<std::vector<std::pair<std::string, double> > > buckets;  // per prompt
  };
  std::vector<Model> models;
};

namespace {

using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

AccumulationOptions options_of(const AccumulationSettings& a, std::size_t prompt_index,
                               const std::string& current_token) {
  AccumulationOptions o;
  o.current_token = parse_current_token(current_token);
  o.block = a.block;
  o.context = a.context;
  o.decode_steps = a.decode_steps;
  o.pseudo_decode = a.pseudo_decode;
  o.static_replay = a.static_replay;
  o.teacher_forced = a.teacher_forced;
  o.free_running = a.free_running;
  // One coupled sampling stream per prompt, fixed by the config's seed.
  o.seed = static_cast<std::uint64_t>(a.seed) * 1000003ull + prompt_index;
  o.temperature = a.temperature;
  o.top_p = a.top_p;
  return o;
}

// Models and fp16 references live for the whole process: every case of a sweep reuses them.
struct Memo {
  std::map<std::string, AccumulationReference> refs;
};
Memo& memo() {
  static Memo m;
  return m;
}

const Runner& runner_for(const AccumulationModel& m, const AccumulationSettings& a) {
  return shared_runner(m.resolved, a.device, a.threads);
}

std::string reference_key(const AccumulationModel& m, const AccumulationSettings& a, std::size_t p,
                          const std::string& current_token) {
  const AccumulationOptions o = options_of(a, p, current_token);
  return m.resolved.string() + "|" + a.device + "|" + a.prompt_ids[p] + "|" + current_token + "|" +
         std::to_string(o.block) + "|" + std::to_string(o.context) + "|" +
         std::to_string(o.decode_steps) + "|" + std::to_string(o.seed) + "|" +
         std::to_string(o.temperature) + "|" + std::to_string(o.top_p) + "|" +
         std::to_string(o.pseudo_decode) + std::to_string(o.teacher_forced) +
         std::to_string(o.free_running);
}

// The fp16 reference of every prompt under one policy, computed where the memo lacks it (spread
// as `plan` says, one prompt per run).
std::vector<const AccumulationReference*> references_for(const Runner& r,
                                                         const AccumulationModel& m,
                                                         const AccumulationSettings& a,
                                                         const std::string& current_token,
                                                         const RunPlan& plan) {
  std::vector<std::string> keys;
  std::vector<std::size_t> missing;
  for (std::size_t p = 0; p < a.prompt_ids.size(); ++p) {
    keys.push_back(reference_key(m, a, p, current_token));
    if (!memo().refs.count(keys.back())) missing.push_back(p);
  }
  std::vector<AccumulationReference> fresh(missing.size());
  for_each_run(static_cast<int>(missing.size()), plan, [&](int i) {
    const std::size_t p = missing[static_cast<std::size_t>(i)];
    // Token-id prompts need no tokenizer (builds without PCRE2, e.g. the GPU image).
    const bool has_ids = p < a.prompt_token_ids.size() && !a.prompt_token_ids[p].empty();
    const std::vector<std::int32_t> ids =
        has_ids ? a.prompt_token_ids[p] : r.encode(a.prompt_texts[p]);
    fresh[static_cast<std::size_t>(i)] =
        accumulation_reference(r.model(), ids, options_of(a, p, current_token));
  });
  for (std::size_t i = 0; i < missing.size(); ++i)
    memo().refs.emplace(keys[missing[i]], std::move(fresh[i]));
  std::vector<const AccumulationReference*> refs;
  for (const std::string& key : keys) refs.push_back(&memo().refs.at(key));
  return refs;
}

// Element-wise mean over prompts, NaN-aware (NaN only where every prompt is NaN).
std::vector<double> mean_rows(const std::vector<std::vector<double> >& per_prompt) {
  std::vector<double> out(per_prompt.empty() ? 0 : per_prompt.front().size(), 0.0);
  for (std::size_t i = 0; i < out.size(); ++i) {
    double s = 0;
    int n = 0;
    for (const auto& v : per_prompt) {
      if (i < v.size() && std::isfinite(v[i])) {
        s += v[i];
        ++n;
      }
    }
    out[i] = n > 0 ? s / n : kNaN;
  }
  return out;
}

std::vector<double> flatten(const std::vector<std::vector<double> >& m) {
  std::vector<double> out;
  for (const auto& r : m) out.insert(out.end(), r.begin(), r.end());
  return out;
}

void write_doubles(H5::Group& g, const std::string& name, const std::vector<double>& v,
                   std::vector<hsize_t> dims = {}) {
  if (dims.empty()) dims = {static_cast<hsize_t>(v.size())};
  h5::write_dataset(g, name, H5::PredType::IEEE_F64LE, H5::PredType::NATIVE_DOUBLE, dims, v.data());
}

void write_ints(H5::Group& g, const std::string& name, const std::vector<std::int32_t>& v,
                std::vector<hsize_t> dims) {
  h5::write_dataset(g, name, H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32, dims, v.data());
}

// accumulation/* and decode/* of one model under `g`, averaged over prompts (tokens per prompt).
void write_model(H5::Group& g, const AccumulationCaseData::Model& m) {
  const auto& P = m.prompts;
  if (P.empty()) return;
  const hsize_t np = P.size();
  const hsize_t L = static_cast<hsize_t>(m.num_layers);
  if (P.front().has_pseudo) {
    H5::Group a = h5::create_group(g, "accumulation");
    const auto& cl = P.front().pseudo.context_len;
    write_doubles(a, "context_len", std::vector<double>(cl.begin(), cl.end()));
    const hsize_t B = cl.size();
    using Field = std::vector<std::vector<double> > PseudoDecodeResult::*;
    const std::tuple<const char*, Field, bool> fields[] = {
        {"mae_accumulated", &PseudoDecodeResult::mae_accumulated, false},
        {"mae_static", &PseudoDecodeResult::mae_static, true},
        {"nmse_accumulated", &PseudoDecodeResult::nmse_accumulated, false},
        {"nmse_static", &PseudoDecodeResult::nmse_static, true}};
    for (const auto& [name, f, is_static] : fields) {
      if (is_static && !P.front().pseudo.has_static()) continue;
      std::vector<std::vector<double> > per_prompt;
      for (const AccumulationResult& r : P) per_prompt.push_back(flatten(r.pseudo.*f));
      const std::vector<double> layer = mean_rows(per_prompt);  // [B, L]
      std::vector<double> mean(B);
      for (hsize_t b = 0; b < B; ++b) {
        mean[b] =
            finite_mean(std::vector<double>(layer.begin() + b * L, layer.begin() + (b + 1) * L));
      }
      write_doubles(a, name, mean);
      write_doubles(a, std::string(name) + "_layer", layer, {B, L});
    }
  }
  const bool teacher = P.front().has_teacher, greedy = P.front().has_greedy;
  const bool sampled = P.front().has_sampled;
  if (!teacher && !greedy) return;
  H5::Group d = h5::create_group(g, "decode");
  const std::size_t N = teacher ? P.front().teacher.kl.size() : P.front().greedy.tokens.size();
  std::vector<double> step(N);
  for (std::size_t i = 0; i < N; ++i) step[i] = static_cast<double>(i);
  write_doubles(d, "step", step);
  if (teacher) {
    std::vector<std::vector<double> > kl, top1, drift;
    for (const AccumulationResult& r : P) {
      kl.push_back(r.teacher.kl);
      top1.push_back(r.teacher.top1);
      drift.push_back(flatten(r.teacher.hidden_drift));
    }
    write_doubles(d, "kl", mean_rows(kl));
    write_doubles(d, "top1_agreement", mean_rows(top1));
    write_doubles(d, "hidden_drift", mean_rows(drift), {N, L});
    write_doubles(d, "kl_per_prompt", flatten(kl), {np, N});
  }
  auto free = [&](const char* name, const FreeRunResult AccumulationResult::*f) {
    H5::Group fg = h5::create_group(d, name);
    std::vector<std::int32_t> toks, refs;
    std::vector<double> first, agree;
    std::vector<std::vector<double> > kl;
    for (const AccumulationResult& r : P) {
      const FreeRunResult& x = r.*f;
      toks.insert(toks.end(), x.tokens.begin(), x.tokens.end());
      refs.insert(refs.end(), x.tokens_ref.begin(), x.tokens_ref.end());
      first.push_back(x.first_divergence);
      agree.push_back(x.token_agreement);
      kl.push_back(x.kl);
    }
    write_ints(fg, "tokens", toks, {np, N});
    write_ints(fg, "tokens_ref", refs, {np, N});
    write_doubles(fg, "first_divergence", first);
    write_doubles(fg, "token_agreement", agree);
    write_doubles(fg, "kl", mean_rows(kl));
    write_doubles(fg, "kl_per_prompt", flatten(kl), {np, N});
  };
  if (greedy) free("greedy", &AccumulationResult::greedy);
  if (sampled) free("sampled", &AccumulationResult::sampled);
}

// Cells' values by position bucket as summary entries "<name>.headline" (cells reading a
// quantized token), "<name>.all_rows" (every cell) and "<name>.bucket.<label>".
void add_bucket_entries(const std::string& name, const std::vector<double>& values,
                        const std::vector<int>& distances, bool all_rows,
                        std::vector<std::pair<std::string, double> >& out) {
  const BucketSummary b = summarize_by_bucket(values, distances);
  if (b.headline_rows > 0) out.emplace_back(name + ".headline", b.headline);
  if (all_rows && b.total_rows > 0) out.emplace_back(name + ".all_rows", b.all_rows);
  for (std::size_t i = 0; i < b.labels.size(); ++i)
    if (b.rows[i] > 0) out.emplace_back(name + ".bucket." + b.labels[i], b.mean[i]);
}

// Position-bucket summaries of one prompt (docs/metrics.md, "Position buckets"): pseudo-decode
// (block, layer) cells over every block and at the last block, teacher-forced steps.
std::vector<std::pair<std::string, double> > bucket_summary(const Method& method, int head_dim,
                                                            int num_layers, int block,
                                                            bool quantized,
                                                            const AccumulationResult& r) {
  std::vector<std::pair<std::string, double> > out;
  if (r.has_pseudo && !r.pseudo.context_len.empty()) {
    const auto& cl = r.pseudo.context_len;
    using Field = std::vector<std::vector<double> > PseudoDecodeResult::*;
    const std::tuple<const char*, Field, bool> fields[] = {
        {"accumulation.mae_accumulated", &PseudoDecodeResult::mae_accumulated, false},
        {"accumulation.nmse_accumulated", &PseudoDecodeResult::nmse_accumulated, false},
        {"accumulation.mae_static", &PseudoDecodeResult::mae_static, true},
        {"accumulation.nmse_static", &PseudoDecodeResult::nmse_static, true}};
    for (const auto& [name, f, is_static] : fields) {
      if (is_static && !r.pseudo.has_static()) continue;
      const auto d = block_distances(method, head_dim, num_layers, cl, quantized, is_static);
      const auto& v = r.pseudo.*f;
      std::vector<double> cells, last(v.back().begin(), v.back().end());
      std::vector<int> dist;
      for (std::size_t j = 0; j < v.size(); ++j) {
        cells.insert(cells.end(), v[j].begin(), v[j].end());
        dist.insert(dist.end(), d[j].begin(), d[j].end());
      }
      add_bucket_entries(name, cells, dist, true, out);
      // The last block over the layers that read a quantized token (TurboQuant's fp16 boundary
      // layers read none).
      const BucketSummary fin = summarize_by_bucket(last, d.back());
      if (fin.headline_rows > 0)
        out.emplace_back(std::string(name) + ".final.headline", fin.headline);
    }
  }
  if (r.has_teacher && !r.teacher.kl.empty()) {
    const int context =
        r.has_pseudo && !r.pseudo.context_len.empty() ? r.pseudo.context_len.back() : 0;
    if (context > 0) {
      const int last_start = ((context - 1) / block) * block;
      const std::vector<int> d =
          decode_step_distances(method, head_dim, num_layers, context, last_start,
                                static_cast<int>(r.teacher.kl.size()), quantized);
      add_bucket_entries("decode.kl", r.teacher.kl, d, false, out);
      const BucketSummary top1 = summarize_by_bucket(r.teacher.top1, d);
      if (top1.headline_rows > 0) out.emplace_back("decode.top1_agreement.headline", top1.headline);
    }
  }
  return out;
}

}  // namespace

namespace {

// Summary rows of one model: means over prompts of each prompt's summary; per-layer rows for the
// final block and the hidden drift.
// `bits` steady state, `eff` model-level effective bits at the context length (fp16
// sink/tail/windows and boundary layers included); `policy` the current-token policy.
void add_summary_rows(const CaseSpec& cs, const AccumulationModel& m, double bits, double eff,
                      const std::string& policy, const AccumulationCaseData::Model& md,
                      const BootstrapOptions& bopts, json& rows) {
  auto row = [&](const std::string& metric, json layer, double value,
                 const std::optional<BootstrapCi>& ci = std::nullopt) {
    json r = {{"case_id", cs.id},
              {"method", cs.name},
              {"spec", cs.spec},
              {"family", cs.family},
              {"data", md.name},
              {"bits_per_element", bits},
              {"effective_bits", eff},
              {"current_token", policy},
              {"metric", metric},
              {"scope", metric.substr(0, metric.find('.'))},
              {"layer", std::move(layer)},
              {"head", "all"},
              {"value", json_number(value)}};
    add_ci_columns(ci, r);
    rows.push_back(std::move(r));
  };
  std::vector<std::string> names;
  std::map<std::string, std::vector<double> > values;
  for (std::size_t p = 0; p < md.prompts.size(); ++p) {
    auto entries = accumulation_summary(md.prompts[p]);
    entries.insert(entries.end(), md.buckets[p].begin(), md.buckets[p].end());
    for (const auto& [k, v] : entries) {
      if (!values.count(k)) names.push_back(k);
      values[k].push_back(v);
    }
  }
  // Means over prompts, each with its bootstrap CI over the prompts (>= 2 finite values).
  for (const std::string& k : names) {
    std::vector<double> finite;
    for (double v : values[k])
      if (std::isfinite(v)) finite.push_back(v);
    std::optional<BootstrapCi> ci;
    if (finite.size() >= 2) ci = bootstrap_mean_ci(finite, bopts);
    row(k, "all", finite_mean(values[k]), ci);
  }
  const AccumulationResult& f = md.prompts.front();
  for (int l = 0; l < m.num_layers; ++l) {
    std::vector<double> acc, sta, drift;
    for (const AccumulationResult& res : md.prompts) {
      if (res.has_pseudo) {
        acc.push_back(res.pseudo.mae_accumulated.back()[l]);
        if (res.pseudo.has_static()) sta.push_back(res.pseudo.mae_static.back()[l]);
      }
      if (res.has_teacher) {
        std::vector<double> d;
        for (const auto& s : res.teacher.hidden_drift) d.push_back(s[l]);
        drift.push_back(finite_mean(d));
      }
    }
    if (f.has_pseudo) {
      row("accumulation.mae_accumulated.final", l, finite_mean(acc));
      if (f.pseudo.has_static()) row("accumulation.mae_static.final", l, finite_mean(sta));
    }
    if (f.has_teacher) row("decode.hidden_drift.mean", l, finite_mean(drift));
  }
}

}  // namespace

AccumulationCase run_accumulation_case(const SweepConfig& cfg, const CaseSpec& cs) {
  const AccumulationSettings& a = cfg.accumulation;
  AccumulationCase out;
  out.data = std::make_shared<AccumulationCaseData>();
  const std::unique_ptr<Method> method = make_method(cs.spec);
  json models = json::array();
  // One run per model and current-token policy; "exact" keeps the model's name as its `data`
  // label, other policies add "@<policy>".
  std::vector<std::pair<const AccumulationModel*, std::string> > runs;
  for (const AccumulationModel& m : a.models)
    for (const std::string& policy : a.current_token) runs.emplace_back(&m, policy);
  for (const auto& [model, policy] : runs) {
    const AccumulationModel& m = *model;
    AccumulationCaseData::Model md;
    md.name = policy == "exact" ? m.name : m.name + "@" + policy;
    md.num_layers = m.num_layers;
    json jm = {
        {"model", md.name}, {"path", m.path}, {"head_dim", m.head_dim}, {"current_token", policy}};
    try {
      method->check_head_dim(m.head_dim);
    } catch (const Error& e) {
      // A method that cannot hold this model's heads (e.g. a group larger than head_dim).
      jm["skipped"] = e.what();
      models.push_back(jm);
      out.data->models.push_back(std::move(md));
      continue;
    }
    const Runner& r = runner_for(m, a);
    // Prompts are independent runs: on the CPU they run side by side, one thread each.
    const int P = static_cast<int>(a.prompt_ids.size());
    const RunPlan plan = plan_runs(P, a.threads, a.device);
    const std::vector<const AccumulationReference*> refs = references_for(r, m, a, policy, plan);
    std::vector<AccumulationResult> results(a.prompt_ids.size());
    for_each_run(P, plan, [&](int p) {
      const std::size_t i = static_cast<std::size_t>(p);
      results[i] = run_accumulation(r.model(), *refs[i], cs.spec, options_of(a, i, policy));
    });
    json prompts = json::array();
    for (std::size_t p = 0; p < a.prompt_ids.size(); ++p) {
      const AccumulationReference& ref = *refs[p];
      AccumulationResult& res = results[p];
      json jr = to_json(res);
      // Position-bucket summaries join the prompt's summary (the report pairs prompts on them).
      md.buckets.push_back(
          bucket_summary(*method, m.head_dim, m.num_layers, a.block, policy == "quantized", res));
      for (const auto& [k, v] : md.buckets.back()) jr["summary"][k] = json_number(v);
      jr["prompt_id"] = a.prompt_ids[p];
      jr["prompt_tokens"] = ref.prompt_tokens;
      prompts.push_back(std::move(jr));
      md.prompts.push_back(std::move(res));
    }
    jm["prompts"] = std::move(prompts);
    models.push_back(std::move(jm));
    add_summary_rows(cs, m, method->accounting(m.head_dim).bits_per_element(),
                     model_effective_bits(*method, m.head_dim, a.context, m.num_layers), policy, md,
                     row_bootstrap_options(cfg.seed), out.rows);
    out.data->models.push_back(std::move(md));
  }
  out.record = {{"models", std::move(models)},
                {"prompt_ids", a.prompt_ids},
                {"block", a.block},
                {"context", a.context},
                {"decode_steps", a.decode_steps},
                {"current_token", a.current_token}};
  return out;
}

void write_accumulation_arrays(H5::Group& root, const AccumulationCase& acc) {
  if (!acc.data) return;
  H5::Group models = h5::create_group(root, "accumulation_models");
  for (std::size_t i = 0; i < acc.data->models.size(); ++i) {
    const AccumulationCaseData::Model& m = acc.data->models[i];
    if (m.prompts.empty()) continue;
    // The report plots the root arrays: the first configured model's, never a substitute.
    if (i == 0) write_model(root, m);
    H5::Group g = h5::create_group(models, m.name);
    write_model(g, m);
  }
}

}  // namespace kvarn
