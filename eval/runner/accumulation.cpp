// Error accumulation with the quantizer in the model loop: pseudo-decode (accumulated vs static),
// teacher-forced and free-running decode against an fp16 reference run (accumulation.hpp).
#include "kvarn/runner/accumulation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {

// The method's cache in the host path (CPU quantization + device mirror), also on CUDA: the
// reference is an exact_fp16 host cache, and the protocol needs the fp16 method to equal it bit
// for bit (zero error) and every method's rows to be readable. The GPU paged cache
// (KvPlacement::kAuto on CUDA) is the production path and is tested against this one instead.
ModelKvCache host_cache(const Model& model, const std::string& spec) {
  ModelKvCache c = model.make_cache(spec);
  c.set_placement(KvPlacement::kHost);
  return c;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Runs `tokens` through `cache` in blocks of `block`; `on_block(start, result)` sees each block.
// Only the last block computes logits (and hidden states when asked): decoding starts from it.
template <class F>
void run_blocks(const Model& model, ModelKvCache& cache, std::span<const std::int32_t> tokens,
                int block, ChunkAttention current_token, bool attention_outputs, bool last_hidden,
                F&& on_block) {
  const int n = static_cast<int>(tokens.size());
  for (int start = 0; start < n; start += block) {
    const int len = std::min(block, n - start);
    const bool last = start + len == n;
    ForwardOptions fo;
    fo.logits = last ? LogitsMode::kLast : LogitsMode::kNone;
    fo.chunk_attention = current_token;
    fo.attention_outputs = attention_outputs;
    fo.hidden_states = last && last_hidden;
    on_block(start, model.forward(cache, tokens.subspan(start, len), fo));
  }
}

// The last row of every layer's hidden state: [layers, hidden].
Matrix last_hidden_rows(const ForwardResult& r) {
  KVARN_CHECK(!r.hidden_states.empty(), "accumulation: hidden states missing");
  Matrix h(static_cast<Eigen::Index>(r.hidden_states.size()), r.hidden_states.front().cols());
  for (std::size_t l = 0; l < r.hidden_states.size(); ++l) {
    h.row(static_cast<Eigen::Index>(l)) = r.hidden_states[l].bottomRows(1);
  }
  return h;
}

std::span<const float> row_span(const Matrix& m, Eigen::Index r) {
  return {m.data() + r * m.cols(), static_cast<std::size_t>(m.cols())};
}

// One decode step under the current-token policy; hidden states when asked.
ForwardResult step(const Model& model, ModelKvCache& cache, std::int32_t token,
                   ChunkAttention current_token, bool hidden_states) {
  ForwardOptions fo;
  fo.chunk_attention = current_token;
  fo.hidden_states = hidden_states;
  return model.forward(cache, std::span<const std::int32_t>(&token, 1), fo);
}

std::vector<float> step_logits(const Model& model, ModelKvCache& cache, std::int32_t token,
                               ChunkAttention current_token) {
  const ForwardResult r = step(model, cache, token, current_token, false);
  return {r.logits.data(), r.logits.data() + r.logits.size()};
}

// MAE and NMSE of `a` against rows [first, first + a.rows()) of `ref`, in double.
std::pair<double, double> mae_nmse(const Matrix& a, const Matrix& ref, Eigen::Index first) {
  double abs_sum = 0, err = 0, den = 0;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      const double r = ref(first + i, j);
      const double d = static_cast<double>(a(i, j)) - r;
      abs_sum += std::abs(d);
      err += d * d;
      den += r * r;
    }
  }
  const double n = static_cast<double>(a.size());
  return {n > 0 ? abs_sum / n : 0.0, den > 0 ? err / den : (err > 0 ? kNaN : 0.0)};
}

// One uniform draw in [0, 1) from 53 random bits: the same on every platform (std's
// distributions are implementation-defined).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Appends rows [0, n) of per-(layer, head) matrices to one layer of `cache`.
void append_rows(ModelKvCache& cache, int layer, const std::vector<MatrixMap>& k,
                 const std::vector<MatrixMap>& v, int n) {
  if (n <= 0) return;
  const KvGeometry& g = cache.geometry();
  const std::size_t per_head = static_cast<std::size_t>(n) * g.head_dim;
  std::vector<float> kb(per_head * g.num_kv_heads), vb(kb.size());
  for (int h = 0; h < g.num_kv_heads; ++h) {
    std::copy_n(k[h].data(), per_head, kb.data() + h * per_head);  // row-major: a prefix
    std::copy_n(v[h].data(), per_head, vb.data() + h * per_head);
  }
  cache.append(layer, kb.data(), vb.data(), n);
}

void check_options(const AccumulationOptions& o) {
  KVARN_CHECK(o.block >= 1, "accumulation: block must be >= 1 (got ", o.block, ")");
  KVARN_CHECK(o.context >= 1, "accumulation: context must be >= 1 (got ", o.context, ")");
  KVARN_CHECK(o.decode_steps >= 1, "accumulation: decode_steps must be >= 1 (got ", o.decode_steps,
              ")");
  KVARN_CHECK(o.top_p > 0 && o.top_p <= 1, "accumulation: top_p must be in (0, 1]");
}

// Free-running decode from the cache state after the context (`logits` = next-token logits).
// `pick(step, logits)` chooses the token; KL against `ref_logits` while the prefixes agree.
template <class Pick>
FreeRunResult free_run(const Model& model, ModelKvCache& cache, ChunkAttention current_token,
                       std::vector<float> logits, const std::vector<std::int32_t>& ref_tokens,
                       const Matrix& ref_logits, int steps, Pick&& pick) {
  FreeRunResult r;
  r.tokens_ref = ref_tokens;
  r.first_divergence = steps;
  int agree = 0;
  for (int t = 0; t < steps; ++t) {
    // Until the first divergence both runs have seen the same tokens, so the two distributions
    // are conditioned on the same prefix; afterwards KL would compare different contexts.
    r.kl.push_back(t <= r.first_divergence ? next_token_kl(row_span(ref_logits, t), logits) : kNaN);
    const std::int32_t tok = pick(t, logits);
    r.tokens.push_back(tok);
    if (tok == ref_tokens[static_cast<std::size_t>(t)]) {
      ++agree;
    } else if (r.first_divergence == steps) {
      r.first_divergence = t;
    }
    if (t + 1 < steps) logits = step_logits(model, cache, tok, current_token);
  }
  r.token_agreement = static_cast<double>(agree) / steps;
  return r;
}

}  // namespace

std::string current_token_name(ChunkAttention policy) {
  return policy == ChunkAttention::kCache ? "quantized" : "exact";
}

ChunkAttention parse_current_token(const std::string& name) {
  if (name == "exact") return ChunkAttention::kExact;
  if (name == "quantized") return ChunkAttention::kCache;
  fail("current-token policy '", name, "': expected exact or quantized");
}

double finite_mean(const std::vector<double>& v) {
  double s = 0;
  int n = 0;
  for (double x : v) {
    if (std::isfinite(x)) {
      s += x;
      ++n;
    }
  }
  return n > 0 ? s / n : kNaN;
}

namespace {}  // namespace

double next_token_kl(std::span<const float> p_logits, std::span<const float> q_logits) {
  KVARN_CHECK(p_logits.size() == q_logits.size() && !p_logits.empty(),
              "next_token_kl: logits of different sizes (", p_logits.size(), " vs ",
              q_logits.size(), ")");
  auto lse = [](std::span<const float> x) {
    const double m = *std::max_element(x.begin(), x.end());
    double s = 0;
    for (float v : x) s += std::exp(static_cast<double>(v) - m);
    return m + std::log(s);
  };
  const double lp = lse(p_logits), lq = lse(q_logits);
  double kl = 0;
  for (std::size_t i = 0; i < p_logits.size(); ++i) {
    const double a = p_logits[i] - lp, b = q_logits[i] - lq;
    kl += std::exp(a) * (a - b);
  }
  return std::max(0.0, kl);
}

std::int32_t sample_top_p(std::span<const float> logits, double temperature, double top_p,
                          double u) {
  KVARN_CHECK(!logits.empty() && temperature > 0, "sample_top_p: empty logits or temperature <= 0");
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = std::exp((logits[i] - m) / temperature);
    z += p[i];
  }
  std::vector<std::int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::int32_t a, std::int32_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
  double kept = 0;
  std::size_t n = 0;
  while (n < order.size() && (n == 0 || kept < top_p * z)) kept += p[order[n++]];
  double target = u * kept, c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    c += p[order[i]];
    if (target < c) return order[i];
  }
  return order[n - 1];
}

AccumulationReference accumulation_reference(const Model& model,
                                             std::span<const std::int32_t> prompt,
                                             const AccumulationOptions& o) {
  check_options(o);
  KVARN_CHECK(!prompt.empty(), "accumulation: empty prompt");
  const ModelConfig& cfg = model.config();
  AccumulationReference ref;
  ref.current_token = o.current_token;
  ref.prompt_tokens = std::min(static_cast<int>(prompt.size()), o.context);
  ref.context.assign(prompt.begin(), prompt.begin() + ref.prompt_tokens);
  if (ref.prompt_tokens < o.context) {
    // A real decoder's context: the prompt continued by the fp16 model itself (EOS ignored).
    ModelKvCache gen = model.make_cache("exact_fp16");
    const auto cont = model.generate_greedy(gen, ref.context, o.context - ref.prompt_tokens);
    ref.context.insert(ref.context.end(), cont.begin(), cont.end());
  }

  // The reference pseudo-decode: same blocks as the methods, exact fp16 cache.
  ModelKvCache cache = model.make_cache("exact_fp16");
  const bool decode = o.teacher_forced || o.free_running;
  ref.attention.assign(cfg.num_layers, Matrix(o.context, cfg.hidden_size));
  std::vector<float> logits;
  Matrix hidden;
  run_blocks(model, cache, ref.context, o.block, o.current_token, o.pseudo_decode, decode,
             [&](int start, const ForwardResult& r) {
               for (std::size_t l = 0; l < r.attention_outputs.size(); ++l) {
                 ref.attention[l].middleRows(start, r.tokens) = r.attention_outputs[l];
               }
               if (r.logits.rows() > 0) {
                 logits.assign(r.logits.data(), r.logits.data() + r.logits.size());
               }
               if (!r.hidden_states.empty()) hidden = last_hidden_rows(r);
             });
  if (!o.pseudo_decode) ref.attention.clear();
  if (o.pseudo_decode) {
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int h = 0; h < cfg.num_kv_heads; ++h) {
        ref.keys.emplace_back(cache.keys(l, h));
        ref.values.emplace_back(cache.values(l, h));
      }
    }
  }
  if (!decode) return ref;

  const int steps = o.decode_steps;
  ref.greedy_logits.resize(steps, cfg.vocab_size);
  for (int t = 0; t < steps; ++t) {
    ref.greedy_logits.row(t) = Eigen::Map<const Eigen::RowVectorXf>(logits.data(), cfg.vocab_size);
    ref.greedy_hidden.push_back(hidden);
    const std::int32_t tok = argmax(logits);
    ref.greedy_tokens.push_back(tok);
    if (t + 1 == steps) break;
    const ForwardResult r = step(model, cache, tok, o.current_token, true);
    logits.assign(r.logits.data(), r.logits.data() + r.logits.size());
    hidden = last_hidden_rows(r);
  }

  if (o.free_running && o.temperature > 0) {
    ModelKvCache sc = model.make_cache("exact_fp16");
    run_blocks(model, sc, ref.context, o.block, o.current_token, false, false,
               [&](int, const ForwardResult& r) {
                 if (r.logits.rows() > 0) {
                   logits.assign(r.logits.data(), r.logits.data() + r.logits.size());
                 }
               });
    std::mt19937_64 rng(o.seed);
    ref.sampled_logits.resize(steps, cfg.vocab_size);
    for (int t = 0; t < steps; ++t) {
      ref.sampled_logits.row(t) =
          Eigen::Map<const Eigen::RowVectorXf>(logits.data(), cfg.vocab_size);
      const std::int32_t tok = sample_top_p(logits, o.temperature, o.top_p, uniform01(rng));
      ref.sampled_tokens.push_back(tok);
      if (t + 1 < steps) logits = step_logits(model, sc, tok, o.current_token);
    }
  }
  return ref;
}

namespace {

// The accumulated pseudo-decode (the method's cache filled block by block) and, from the same
// cache, teacher-forced decoding.
void accumulated_and_teacher_forced(const Model& model, const AccumulationReference& ref,
                                    const std::string& method_spec, const AccumulationOptions& o,
                                    AccumulationResult& res) {
  const int L = model.config().num_layers;
  const int steps = o.decode_steps;
  ModelKvCache cache = host_cache(model, method_spec);
  std::vector<float> logits;
  Matrix hidden;
  PseudoDecodeResult& p = res.pseudo;
  run_blocks(model, cache, ref.context, o.block, o.current_token, o.pseudo_decode,
             o.teacher_forced, [&](int start, const ForwardResult& r) {
               if (o.pseudo_decode) {
                 p.context_len.push_back(start + r.tokens);
                 std::vector<double> mae(L), nmse(L);
                 for (int l = 0; l < L; ++l) {
                   std::tie(mae[l], nmse[l]) =
                       mae_nmse(r.attention_outputs[l], ref.attention[l], start);
                 }
                 p.mae_accumulated.push_back(std::move(mae));
                 p.nmse_accumulated.push_back(std::move(nmse));
               }
               if (r.logits.rows() > 0) {
                 logits.assign(r.logits.data(), r.logits.data() + r.logits.size());
               }
               if (!r.hidden_states.empty()) hidden = last_hidden_rows(r);
             });
  res.has_pseudo = o.pseudo_decode;

  if (o.teacher_forced) {
    TeacherForcedResult& tf = res.teacher;
    for (int t = 0; t < steps; ++t) {
      const Matrix& hr = ref.greedy_hidden[t];
      tf.kl.push_back(next_token_kl(row_span(ref.greedy_logits, t), logits));
      tf.top1.push_back(argmax(logits) == ref.greedy_tokens[t] ? 1.0 : 0.0);
      std::vector<double> drift(L);
      for (int l = 0; l < L; ++l) {
        const double den = hr.row(l).cast<double>().norm();
        const double num = (hidden.row(l).cast<double>() - hr.row(l).cast<double>()).norm();
        drift[l] = den > 0 ? num / den : (num > 0 ? kNaN : 0.0);
      }
      tf.hidden_drift.push_back(std::move(drift));
      if (t + 1 == steps) break;
      const std::int32_t tok = ref.greedy_tokens[t];  // teacher forcing
      const ForwardResult r = step(model, cache, tok, o.current_token, true);
      logits.assign(r.logits.data(), r.logits.data() + r.logits.size());
      hidden = last_hidden_rows(r);
    }
    res.has_teacher = true;
  }
}

// Static pseudo-decode: the method's final cache of the fp16 run's K/V (quantized once, its own
// policy: sinks, tails, windows as at the end of the context); block j reads its first start_j
// rows.
void static_pseudo_decode(const Model& model, const AccumulationReference& ref,
                          const std::string& method_spec, const AccumulationOptions& o,
                          AccumulationResult& res) {
  const ModelConfig& cfg = model.config();
  const int L = cfg.num_layers, Hk = cfg.num_kv_heads;
  ModelKvCache fin = host_cache(model, method_spec);
  for (int l = 0; l < L; ++l) {
    std::vector<MatrixMap> k, v;
    for (int h = 0; h < Hk; ++h) {
      const Matrix& km = ref.keys[static_cast<std::size_t>(l * Hk + h)];
      const Matrix& vm = ref.values[static_cast<std::size_t>(l * Hk + h)];
      k.emplace_back(km.data(), km.rows(), km.cols());
      v.emplace_back(vm.data(), vm.rows(), vm.cols());
    }
    append_rows(fin, l, k, v, o.context);
  }
  PseudoDecodeResult& p = res.pseudo;
  for (int start = 0; start < o.context; start += o.block) {
    const int len = std::min(o.block, o.context - start);
    // An fp32 exact cache holds the reconstruction as is. Under the `quantized` policy the
    // block reads itself back from the cache, so the cache is fp16 like the reference's (the
    // prefix rows then pass through fp16 too; the fp16 method's rows are fp16 already).
    const bool read_back = o.current_token == ChunkAttention::kCache;
    ModelKvCache c = ModelKvCache::exact(cfg.kv_geometry(), read_back);
    for (int l = 0; l < L; ++l) {
      std::vector<MatrixMap> k, v;
      for (int h = 0; h < Hk; ++h) {
        k.push_back(fin.keys(l, h));
        v.push_back(fin.values(l, h));
      }
      append_rows(c, l, k, v, start);
    }
    ForwardOptions fo;
    fo.logits = LogitsMode::kNone;
    fo.chunk_attention = o.current_token;
    fo.attention_outputs = true;
    const ForwardResult r =
        model.forward(c, std::span<const std::int32_t>(ref.context).subspan(start, len), fo);
    std::vector<double> mae(L), nmse(L);
    for (int l = 0; l < L; ++l) {
      std::tie(mae[l], nmse[l]) = mae_nmse(r.attention_outputs[l], ref.attention[l], start);
    }
    p.mae_static.push_back(std::move(mae));
    p.nmse_static.push_back(std::move(nmse));
  }
}

// Free-running decoding after the context: greedy, and sampled with the reference's draws.
void run_free_running(const Model& model, const AccumulationReference& ref,
                      const std::string& method_spec, const AccumulationOptions& o,
                      AccumulationResult& res) {
  const int steps = o.decode_steps;
  auto after_context = [&](ModelKvCache& c) {
    std::vector<float> logits;
    run_blocks(model, c, ref.context, o.block, o.current_token, false, false,
               [&](int, const ForwardResult& r) {
                 if (r.logits.rows() > 0) {
                   logits.assign(r.logits.data(), r.logits.data() + r.logits.size());
                 }
               });
    return logits;
  };
  {
    ModelKvCache c = host_cache(model, method_spec);
    res.greedy = free_run(model, c, o.current_token, after_context(c), ref.greedy_tokens,
                          ref.greedy_logits, steps,
                          [](int, const std::vector<float>& lg) { return argmax(lg); });
    res.has_greedy = true;
  }
  if (o.temperature > 0) {
    ModelKvCache c = host_cache(model, method_spec);
    std::mt19937_64 rng(o.seed);  // the reference's stream: coupled draws
    res.sampled = free_run(model, c, o.current_token, after_context(c), ref.sampled_tokens,
                           ref.sampled_logits, steps, [&](int, const std::vector<float>& lg) {
                             return sample_top_p(lg, o.temperature, o.top_p, uniform01(rng));
                           });
    res.has_sampled = true;
  }
}

}  // namespace

AccumulationResult run_accumulation(const Model& model, const AccumulationReference& ref,
                                    const std::string& method_spec, const AccumulationOptions& o) {
  check_options(o);
  const ModelConfig& cfg = model.config();
  const int L = cfg.num_layers;
  const int steps = o.decode_steps;
  KVARN_CHECK(static_cast<int>(ref.context.size()) == o.context,
              "accumulation: reference made for another context length");
  KVARN_CHECK(ref.current_token == o.current_token,
              "accumulation: reference run with current token ",
              current_token_name(ref.current_token), ", method asked with ",
              current_token_name(o.current_token));
  AccumulationResult res;
  res.method = method_spec;
  res.current_token = o.current_token;
  const bool decode = o.teacher_forced || o.free_running;
  KVARN_CHECK(!o.pseudo_decode || static_cast<int>(ref.attention.size()) == L,
              "accumulation: reference lacks the pseudo-decode outputs");
  KVARN_CHECK(!decode || static_cast<int>(ref.greedy_tokens.size()) == steps,
              "accumulation: reference lacks the decode steps");

  if (o.pseudo_decode || o.teacher_forced) {
    accumulated_and_teacher_forced(model, ref, method_spec, o, res);
  }
  if (o.pseudo_decode && o.static_replay) static_pseudo_decode(model, ref, method_spec, o, res);
  if (o.free_running) run_free_running(model, ref, method_spec, o, res);
  return res;
}

std::vector<std::pair<std::string, double>> accumulation_summary(const AccumulationResult& r) {
  std::vector<std::pair<std::string, double>> m;
  if (r.has_pseudo && !r.pseudo.context_len.empty()) {
    const PseudoDecodeResult& p = r.pseudo;
    const std::size_t last = p.context_len.size() - 1;
    // Block 0 has no cached context (zero error by construction); block 1 is the first that
    // reads the quantized cache.
    const std::size_t first = std::min<std::size_t>(1, last);
    const double acc = finite_mean(p.mae_accumulated[last]);
    const double acc1 = finite_mean(p.mae_accumulated[first]);
    m.emplace_back("accumulation.mae_accumulated.final", acc);
    m.emplace_back("accumulation.nmse_accumulated.final", finite_mean(p.nmse_accumulated[last]));
    m.emplace_back("accumulation.mae_accumulated.first", acc1);
    // Ratios only where defined (the fp16 method has zero error everywhere): no NaN rows.
    if (acc1 > 0) m.emplace_back("accumulation.mae_accumulated.growth", acc / acc1);
    if (p.has_static()) {
      const double sta = finite_mean(p.mae_static[last]);
      m.emplace_back("accumulation.mae_static.final", sta);
      m.emplace_back("accumulation.nmse_static.final", finite_mean(p.nmse_static[last]));
      m.emplace_back("accumulation.mae_static.first", finite_mean(p.mae_static[first]));
      if (sta > 0) m.emplace_back("accumulation.mae_ratio.final", acc / sta);
    }
  }
  if (r.has_teacher) {
    const TeacherForcedResult& t = r.teacher;
    m.emplace_back("decode.kl.mean", finite_mean(t.kl));
    m.emplace_back("decode.kl.max", *std::max_element(t.kl.begin(), t.kl.end()));
    m.emplace_back("decode.top1_agreement", finite_mean(t.top1));
    std::vector<double> last_layer, all;
    for (const auto& d : t.hidden_drift) {
      last_layer.push_back(d.back());
      all.insert(all.end(), d.begin(), d.end());
    }
    m.emplace_back("decode.hidden_drift.last_layer", finite_mean(last_layer));
    m.emplace_back("decode.hidden_drift.mean", finite_mean(all));
  }
  if (r.has_greedy) {
    m.emplace_back("decode.first_divergence", r.greedy.first_divergence);
    m.emplace_back("decode.token_agreement", r.greedy.token_agreement);
    m.emplace_back("decode.free_kl.mean", finite_mean(r.greedy.kl));
  }
  if (r.has_sampled) {
    m.emplace_back("decode.sampled.first_divergence", r.sampled.first_divergence);
    m.emplace_back("decode.sampled.token_agreement", r.sampled.token_agreement);
    m.emplace_back("decode.sampled.kl.mean", finite_mean(r.sampled.kl));
  }
  return m;
}

nlohmann::json to_json(const AccumulationResult& r) {
  using nlohmann::json;
  auto num = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  auto vec = [&](const std::vector<double>& v) {
    json a = json::array();
    for (double x : v) a.push_back(num(x));
    return a;
  };
  auto mat = [&](const std::vector<std::vector<double>>& v) {
    json a = json::array();
    for (const auto& row : v) a.push_back(vec(row));
    return a;
  };
  json j = {{"method", r.method}, {"current_token", current_token_name(r.current_token)}};
  if (r.has_pseudo) {
    j["pseudo_decode"] = {{"context_len", r.pseudo.context_len},
                          {"mae_accumulated", mat(r.pseudo.mae_accumulated)},
                          {"nmse_accumulated", mat(r.pseudo.nmse_accumulated)}};
    if (r.pseudo.has_static()) {
      j["pseudo_decode"]["mae_static"] = mat(r.pseudo.mae_static);
      j["pseudo_decode"]["nmse_static"] = mat(r.pseudo.nmse_static);
    }
  }
  if (r.has_teacher) {
    j["teacher_forced"] = {{"kl", vec(r.teacher.kl)},
                           {"top1", vec(r.teacher.top1)},
                           {"hidden_drift", mat(r.teacher.hidden_drift)}};
  }
  auto free_json = [&](const FreeRunResult& f) {
    return json{{"tokens_ref", f.tokens_ref},
                {"tokens", f.tokens},
                {"first_divergence", f.first_divergence},
                {"token_agreement", f.token_agreement},
                {"kl", vec(f.kl)}};
  };
  if (r.has_greedy) j["free_running_greedy"] = free_json(r.greedy);
  if (r.has_sampled) j["free_running_sampled"] = free_json(r.sampled);
  json s = json::object();
  for (const auto& [k, v] : accumulation_summary(r)) s[k] = num(v);
  j["summary"] = s;
  return j;
}

}  // namespace kvarn
