// The forward pass in libtorch (ATen only: no autograd, no torch::nn). The only translation unit
// of the runner that includes torch headers.
#include "kvarn/runner/model.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <numbers>
#include <numeric>
#include <set>

#include "kvarn/data/error.hpp"
#include "kvarn/runner/safetensors.hpp"
#if KVARN_RUNNER_GPU_CACHE
#include "kvarn/cuda/paged_cache.hpp"
#endif

namespace kvarn {
namespace {

struct LayerWeights {
  at::Tensor ln1, ln2, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm, w_gate, w_up, w_down;
  at::Tensor b_gate, b_up, b_down;
  bool sliding = false;
};

// Device copy of a ModelKvCache: per layer [kv_heads, capacity, head_dim] in the compute dtype.
struct Mirror {
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  std::vector<at::Tensor> k, v;
  std::vector<int> synced;  // rows [0, synced) are uploaded and final
  at::Tensor scores, probs;  // attention scratch (Model::Impl::attend), grown by doubling
};

// A contiguous tensor of `sizes` over the front of `buf`, which grows (by doubling) when too small.
at::Tensor scratch(at::Tensor& buf, at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (!buf.defined() || buf.numel() < numel || buf.options().dtype() != opts.dtype()) {
    const int64_t grown = buf.defined() ? 2 * buf.numel() : 0;
    buf = at::empty({std::max(numel, grown)}, opts);
  }
  return buf.narrow(0, 0, numel).view(sizes);
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  fail("model: compute dtype '", name, "' is not supported (float32, float16, bfloat16)");
}

// HF LlamaRMSNorm: normalize in fp32, cast back, then scale.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const auto in_dtype = x.scalar_type();
  auto h = x.to(at::kFloat);
  auto var = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(var + eps);
  return w * h.to(in_dtype);
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

Matrix to_matrix(const at::Tensor& t) {  // 2-D tensor -> fp32 row-major Matrix
  auto c = t.to(at::kCPU, at::kFloat).contiguous();
  Matrix m(c.size(0), c.size(1));
  std::memcpy(m.data(), c.data_ptr<float>(), sizeof(float) * c.numel());
  return m;
}

std::vector<Matrix> per_head(const at::Tensor& t) {  // [H, n, D] -> H x [n, D]
  std::vector<Matrix> out;
  for (int64_t h = 0; h < t.size(0); ++h) out.push_back(to_matrix(t[h]));
  return out;
}

// One stderr line per distinct placement decision and process (caches are made by the dozen).
void note_once(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(line).second) std::fprintf(stderr, "kvarn runner: %s\n", line.c_str());
}

#if KVARN_RUNNER_GPU_CACHE
std::uint16_t* half_ptr(const at::Tensor& t) { return static_cast<std::uint16_t*>(t.data_ptr()); }
#endif

}  // namespace

struct Model::Impl {
  std::filesystem::path dir;
  ModelConfig cfg;
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  at::Tensor embed, final_norm, lm_head, inv_freq;
  std::vector<LayerWeights> layers;

  // Loads one tensor, checking dtype and shape; the data is copied out of the mapping.
  at::Tensor load(const SafetensorsCheckpoint& ckpt, std::set<std::string>* used,
                  const std::string& name, std::vector<int64_t> shape) const {
    const SafetensorsFile& f = ckpt.file_of(name);
    const StTensorInfo& info = f.info(name);
    const std::string where = f.path().string() + ": tensor '" + name + "'";
    at::ScalarType src;
    switch (info.dtype) {
      case StDtype::kF32:
        src = at::kFloat;
        break;
      case StDtype::kF16:
        src = at::kHalf;
        break;
      case StDtype::kBF16:
        src = at::kBFloat16;
        break;
      default:
        fail(where, ": dtype ", st_dtype_name(info.dtype), " is not supported (F32, F16, BF16)");
    }
    auto fmt = [](const std::vector<int64_t>& s) {
      std::string out = "[";
      for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
      return out + "]";
    };
    KVARN_CHECK(info.shape == shape, where, ": shape ", fmt(info.shape), " does not match ",
                fmt(shape), " from ", cfg.path.string());
    auto t = at::empty(shape, at::TensorOptions().dtype(src));
    std::memcpy(t.data_ptr(), f.data(info), info.end - info.begin);  // aligned copy
    used->insert(name);
    return t.to(device, dtype).contiguous();
  }

  // Room for `rows` rows in the layer's mirror. It grows by doubling and keeps its rows [0,
  // synced): per-block tensors that grow with the context (a concatenated copy of the cache for
  // every block and layer) leave glibc's heap fragmented, several GB at 8K tokens.
  void reserve(Mirror& m, int layer, int64_t rows) const {
    at::Tensor& k = m.k[layer];
    at::Tensor& v = m.v[layer];
    if (k.defined() && k.size(1) >= rows) return;
    const int64_t cap = std::max<int64_t>(rows, k.defined() ? 2 * k.size(1) : 64);
    auto opts = at::TensorOptions().dtype(dtype).device(device);
    auto nk = at::empty({cfg.num_kv_heads, cap, cfg.head_dim}, opts);
    auto nv = at::empty({cfg.num_kv_heads, cap, cfg.head_dim}, opts);
    if (k.defined() && m.synced[layer] > 0) {
      nk.narrow(1, 0, m.synced[layer]).copy_(k.narrow(1, 0, m.synced[layer]));
      nv.narrow(1, 0, m.synced[layer]).copy_(v.narrow(1, 0, m.synced[layer]));
    }
    k = nk;
    v = nv;
  }

  // Copies the cache's rows [synced, size) of one layer into the mirror; rows that will not
  // change again (cache.final_rows) are not copied twice.
  void sync(ModelKvCache& cache, Mirror& m, int layer) const {
    const auto& g = cache.geometry();
    const int size = cache.size(layer);
    reserve(m, layer, size);
    at::Tensor& k = m.k[layer];
    at::Tensor& v = m.v[layer];
    const int from = m.synced[layer];
    if (from < size) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        for (int which = 0; which < 2; ++which) {
          MatrixMap src = which == 0 ? cache.keys(layer, h) : cache.values(layer, h);
          auto cpu = at::from_blob(const_cast<float*>(src.data()) + from * g.head_dim,
                                   {size - from, g.head_dim}, at::kFloat);
          (which == 0 ? k : v)[h].narrow(0, from, size - from).copy_(cpu);
        }
      }
    }
    m.synced[layer] = cache.final_rows(layer);
  }

  // Decides an undecided cache's placement at its first forward (kv_cache.hpp, KvPlacement).
  void place(ModelKvCache& cache) const {
    if (!cache.placement_note().empty()) return;
    std::string why;
    if (cache.placement() == KvPlacement::kHost) {
      why = "placement kHost";
    } else if (!device.is_cuda()) {
      why = "model on " + device.str();
    } else if (std::find(cfg.sliding_layers.begin(), cfg.sliding_layers.end(), true) !=
               cfg.sliding_layers.end()) {
      why = "sliding-window layers (the paged decode has no window)";
    } else if (cfg.num_heads / cfg.num_kv_heads > 8) {
      why = "more than 8 query heads per KV head";
    } else {
      why = cache.device_unsupported();
    }
    if (why.empty()) {
      cache.bind_device(device.index());
    } else {
      cache.bind_host(why);
    }
    if (device.is_cuda()) note_once(cache.placement_note());
  }

  Mirror& mirror(ModelKvCache& cache) const {
    auto& state = cache.runner_state();
    auto* m = static_cast<Mirror*>(state.get());
    if (m == nullptr || m->device != device || m->dtype != dtype) {
      auto fresh = std::make_shared<Mirror>();
      fresh->device = device;
      fresh->dtype = dtype;
      fresh->k.resize(cfg.num_layers);
      fresh->v.resize(cfg.num_layers);
      fresh->synced.assign(cfg.num_layers, 0);
      state = fresh;
      m = fresh.get();
    }
    return *m;
  }

  // Attention of one layer over its GPU paged cache: kExact stages the chunk in fp16 (the
  // queries see it unquantized), attends, then seals complete tiles; kCache seals first. The
  // kernels run on the legacy default stream, torch's default stream.
  at::Tensor gpu_attention(cuda::PagedCache& pc, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const std::vector<int>& positions, bool cache_first,
                           at::Tensor* finite) const {
#if KVARN_RUNNER_GPU_CACHE
    const int64_t n = q.size(1), hq = q.size(0), d = q.size(2);
    auto k16 = k.to(at::kHalf).contiguous();  // [hk, n, d]
    auto v16 = v.to(at::kHalf).contiguous();
    auto ok = at::logical_and(at::isfinite(k16).all(), at::isfinite(v16).all());
    *finite = finite->defined() ? at::logical_and(*finite, ok) : ok;
    auto q16 = q.transpose(0, 1).to(at::kHalf).contiguous();  // [n, hq, d]
    auto o16 = at::empty({n, hq, d}, q16.options());
    pc.stage(half_ptr(k16), half_ptr(v16), static_cast<int>(n));
    if (cache_first) pc.commit();
    pc.attend(half_ptr(q16), static_cast<int>(hq), positions, half_ptr(o16));
    if (!cache_first) pc.commit();
    return o16.to(dtype).reshape({n, hq * d});
#else
    (void)pc, (void)q, (void)k, (void)v, (void)positions, (void)cache_first, (void)finite;
    fail("forward: the runner was built without the GPU KV cache");
#endif
  }

  // The cache matches the model and holds the same count in every layer; the tokens fit the
  // context and the vocabulary.
  void check_forward_inputs(const ModelKvCache& cache, std::span<const std::int32_t> tokens) const {
    const int n = static_cast<int>(tokens.size());
    const auto& g = cache.geometry();
    KVARN_CHECK(g.num_layers == cfg.num_layers && g.num_kv_heads == cfg.num_kv_heads &&
                    g.head_dim == cfg.head_dim,
                "forward: the KV cache geometry (", g.num_layers, " layers, ", g.num_kv_heads,
                " KV heads, head_dim ", g.head_dim, ") does not match the model ", dir.string());
    const int p0 = cache.size();
    for (int l = 1; l < cfg.num_layers; ++l) {
      KVARN_CHECK(cache.size(l) == p0,
                  "forward: KV cache layers hold different token counts "
                  "(an earlier forward failed half-way?)");
    }
    KVARN_CHECK(n > 0, "forward: no tokens");
    KVARN_CHECK(p0 + n <= cfg.max_position_embeddings, "forward: positions ", p0, "..", p0 + n - 1,
                " exceed max_position_embeddings ", cfg.max_position_embeddings, " of ",
                cfg.path.string());
    for (int i = 0; i < n; ++i) {
      KVARN_CHECK(tokens[i] >= 0 && tokens[i] < cfg.vocab_size, "forward: token id ", tokens[i],
                  " at index ", i, " is outside the vocabulary (", cfg.vocab_size, ")");
    }
  }

  // Attention of one layer over the host cache (exact fp32 rows or a method's reconstruction);
  // returns the output [n, hq * d]. q is [hq, n, d], k and v [hk, n, d], post-RoPE.
  at::Tensor host_attention(ModelKvCache& cache, Mirror& m, int l, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, int p0, int n,
                            const ForwardOptions& opt) const {
    const LayerWeights& w = layers[l];
    // The cache stores fp32 rows on the host; quantize-on-write happens in append().
    auto k_host = k.to(at::kCPU, at::kFloat).contiguous();
    auto v_host = v.to(at::kCPU, at::kFloat).contiguous();
    at::Tensor keys, values;
    if (opt.chunk_attention == ChunkAttention::kCache) {
      cache.append(l, k_host.data_ptr<float>(), v_host.data_ptr<float>(), n);
      sync(cache, m, l);
      keys = m.k[l].narrow(1, 0, p0 + n);
      values = m.v[l].narrow(1, 0, p0 + n);
    } else {
      if (p0 > 0) {
        // The chunk's exact rows go into the mirror after the cache's rows, where the next sync
        // overwrites them with what the cache stored (synced <= p0).
        reserve(m, l, p0 + n);
        sync(cache, m, l);
        m.k[l].narrow(1, p0, n).copy_(k);
        m.v[l].narrow(1, p0, n).copy_(v);
        keys = m.k[l].narrow(1, 0, p0 + n);
        values = m.v[l].narrow(1, 0, p0 + n);
      } else {
        keys = k;
        values = v;
      }
      cache.append(l, k_host.data_ptr<float>(), v_host.data_ptr<float>(), n);
    }
    return attend(m, w, q, keys, values, p0, n);
  }

  // Causal attention of the chunk's queries q [hq, n, d] (positions p0..p0+n-1) over keys and
  // values [hk, p0+n, d]; returns [n, hq * d]. Scores and probabilities live in the mirror's
  // scratch buffers, reused across blocks and layers: fresh tensors growing with the context
  // would fragment the heap (see reserve).
  at::Tensor attend(Mirror& m, const LayerWeights& w, const at::Tensor& q, const at::Tensor& keys,
                    const at::Tensor& values, int p0, int n) const {
    const int64_t hq = cfg.num_heads, hk = cfg.num_kv_heads, d = cfg.head_dim;
    const int64_t rep = hq / hk;
    const int64_t t = p0 + n;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    // GQA without copying K/V: query heads of one KV head become extra rows.
    auto qg = q.reshape({hk, rep * n, d});
    auto scores = scratch(m.scores, {hk, rep * n, t}, q.options());
    at::bmm_out(scores, qg, keys.transpose(1, 2));
    scores.mul_(scale);
    // Causal (and sliding-window) mask: query i (position p0+i) sees key j iff
    // j <= p0+i and p0+i - j < window. Without a window only keys of the chunk itself (j >= p0)
    // can be masked: the mask is applied to those columns alone.
    const int64_t j0 = w.sliding ? 0 : p0;
    const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
    auto qi = at::arange(p0, p0 + n, longs).unsqueeze(1);
    auto kj = at::arange(j0, t, longs).unsqueeze(0);
    auto masked = kj > qi;
    if (w.sliding) masked = masked | (qi - kj >= cfg.sliding_window);
    scores.view({hk, rep, n, t})
        .narrow(3, j0, t - j0)
        .masked_fill_(masked, -std::numeric_limits<float>::infinity());
    auto probs = scratch(m.probs, {hk, rep * n, t}, q.options().dtype(at::kFloat));
    at::_softmax_out(probs, scores.to(at::kFloat), -1, false);
    return at::matmul(probs.to(dtype), values)
        .view({hq, n, d})
        .transpose(0, 1)
        .reshape({n, hq * d});
  }

  // ForwardOptions::capture of one layer: per-head Q, pre- and post-RoPE K, V.
  static void capture_layer(const ForwardOptions& opt, int l, int p0, int n, const at::Tensor& q,
                            const at::Tensor& k_pre, const at::Tensor& k, const at::Tensor& v) {
    if (opt.capture) {
      LayerCapture cap;
      cap.layer = l;
      cap.first_position = p0;
      cap.tokens = n;
      cap.q = per_head(q);
      cap.k_pre_rope = per_head(k_pre);
      cap.k = per_head(k);
      cap.v = per_head(v);
      opt.capture(cap);
    }
  }

  ForwardResult forward(ModelKvCache& cache, std::span<const std::int32_t> tokens,
                        const ForwardOptions& opt) const {
    check_forward_inputs(cache, tokens);
    const int n = static_cast<int>(tokens.size());
    const int p0 = cache.size();
    c10::InferenceMode guard;
    if (p0 == 0) place(cache);
    const bool gpu_cache = cache.on_device();
    Mirror& m = mirror(cache);
    std::vector<int> positions(gpu_cache ? n : 0);
    std::iota(positions.begin(), positions.end(), p0);
    at::Tensor finite;  // GPU cache: all K/V rows finite (checked once, after the layers)
    const int64_t hq = cfg.num_heads, hk = cfg.num_kv_heads, d = cfg.head_dim;
    auto ids = at::from_blob(const_cast<std::int32_t*>(tokens.data()), {n}, at::kInt)
                   .to(device, at::kLong);
    at::Tensor x = embed.index_select(0, ids);  // [n, hidden]

    // RoPE tables for positions p0..p0+n-1 exactly as HF: fp32 outer product, cat(freqs, freqs).
    auto pos =
        at::arange(p0, p0 + n, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat);
    auto freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0);
    auto emb = at::cat({freqs, freqs}, -1);
    auto cos = emb.cos().to(dtype).unsqueeze(0);  // [1, n, D]
    auto sin = emb.sin().to(dtype).unsqueeze(0);

    ForwardResult res;
    res.first_position = p0;
    res.tokens = n;
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerWeights& w = layers[l];
      auto h = rms_norm(x, w.ln1, cfg.rms_norm_eps);
      auto q = linear(h, w.wq, w.bq).view({n, hq, d});
      auto k = linear(h, w.wk, w.bk).view({n, hk, d});
      auto v = linear(h, w.wv, w.bv).view({n, hk, d});
      if (cfg.qk_norm) {
        q = rms_norm(q, w.q_norm, cfg.rms_norm_eps);
        k = rms_norm(k, w.k_norm, cfg.rms_norm_eps);
      }
      q = q.transpose(0, 1);  // [hq, n, d]
      k = k.transpose(0, 1);
      v = v.transpose(0, 1).contiguous();
      auto k_pre = k;
      q = q * cos + rotate_half(q) * sin;
      k = (k * cos + rotate_half(k) * sin).contiguous();
      capture_layer(opt, l, p0, n, q, k_pre, k, v);
      at::Tensor o;  // attention output [n, hq * d]
      if (gpu_cache) {
        o = gpu_attention(*cache.device_layer(l), q, k, v, positions,
                          opt.chunk_attention == ChunkAttention::kCache, &finite);
      } else {
        o = host_attention(cache, m, l, q, k, v, p0, n, opt);
      }
      auto attn = linear(o, w.wo, w.bo);
      if (opt.attention_outputs) res.attention_outputs.push_back(to_matrix(attn));
      x = x + attn;
      h = rms_norm(x, w.ln2, cfg.rms_norm_eps);
      auto mlp = linear(at::silu(linear(h, w.w_gate, w.b_gate)) * linear(h, w.w_up, w.b_up),
                        w.w_down, w.b_down);
      x = x + mlp;
      if (opt.hidden_states) res.hidden_states.push_back(to_matrix(x));
    }
    if (finite.defined()) {
      KVARN_CHECK(finite.item<bool>(), "forward (", dir.string(), "): non-finite K/V at positions ",
                  p0, "..", p0 + n - 1, " (GPU KV cache '", cache.spec(), "')");
    }
    if (opt.logits != LogitsMode::kNone) {
      auto rows = opt.logits == LogitsMode::kAll ? x : x.narrow(0, n - 1, 1);
      res.logits = to_matrix(at::linear(rms_norm(rows, final_norm, cfg.rms_norm_eps), lm_head));
    }
    return res;
  }
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const LoadOptions& options) {
  KVARN_CHECK(std::filesystem::is_directory(dir), dir.string(), ": not a checkpoint directory");
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->cfg = load_model_config(dir / "config.json");
  impl->dtype = parse_dtype(options.dtype);
  try {
    impl->device = at::Device(options.device);
  } catch (const c10::Error&) {
    fail("model: device '", options.device, "' is not valid (cpu, cuda, cuda:N)");
  }
  if (impl->device.is_cuda()) {
    KVARN_CHECK(at::hasCUDA(), "model: device '", options.device,
                "' requested but no CUDA device is available");
  } else {
    KVARN_CHECK(impl->device.is_cpu(), "model: device '", options.device,
                "' is not supported (cpu, cuda)");
  }
  if (options.num_threads > 0) at::set_num_threads(options.num_threads);
  const ModelConfig& c = impl->cfg;
  const SafetensorsCheckpoint ckpt(dir);
  std::set<std::string> used;
  try {
    c10::InferenceMode guard;
    const int64_t hid = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
    const int64_t qdim = c.num_heads * d, kvdim = c.num_kv_heads * d;
    auto ld = [&](const std::string& name, std::vector<int64_t> shape) {
      return impl->load(ckpt, &used, name, std::move(shape));
    };
    impl->embed = ld("model.embed_tokens.weight", {c.vocab_size, hid});
    impl->final_norm = ld("model.norm.weight", {hid});
    if (c.tie_word_embeddings) {
      impl->lm_head = impl->embed;
      if (ckpt.contains("lm_head.weight")) used.insert("lm_head.weight");  // tied: ignored as HF
    } else {
      impl->lm_head = ld("lm_head.weight", {c.vocab_size, hid});
    }
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerWeights w;
      w.ln1 = ld(p + "input_layernorm.weight", {hid});
      w.ln2 = ld(p + "post_attention_layernorm.weight", {hid});
      w.wq = ld(p + "self_attn.q_proj.weight", {qdim, hid});
      w.wk = ld(p + "self_attn.k_proj.weight", {kvdim, hid});
      w.wv = ld(p + "self_attn.v_proj.weight", {kvdim, hid});
      w.wo = ld(p + "self_attn.o_proj.weight", {hid, qdim});
      if (c.qkv_bias) {
        w.bq = ld(p + "self_attn.q_proj.bias", {qdim});
        w.bk = ld(p + "self_attn.k_proj.bias", {kvdim});
        w.bv = ld(p + "self_attn.v_proj.bias", {kvdim});
      }
      if (c.o_bias) w.bo = ld(p + "self_attn.o_proj.bias", {hid});
      if (c.qk_norm) {
        w.q_norm = ld(p + "self_attn.q_norm.weight", {d});
        w.k_norm = ld(p + "self_attn.k_norm.weight", {d});
      }
      w.w_gate = ld(p + "mlp.gate_proj.weight", {inter, hid});
      w.w_up = ld(p + "mlp.up_proj.weight", {inter, hid});
      w.w_down = ld(p + "mlp.down_proj.weight", {hid, inter});
      if (c.mlp_bias) {
        w.b_gate = ld(p + "mlp.gate_proj.bias", {inter});
        w.b_up = ld(p + "mlp.up_proj.bias", {inter});
        w.b_down = ld(p + "mlp.down_proj.bias", {hid});
      }
      w.sliding = c.sliding_layers[l];
      impl->layers.push_back(std::move(w));
    }
    for (const auto& name : ckpt.names()) {
      // Non-persistent buffers some exporters keep; everything else unexpected is an error.
      if (used.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
      fail(ckpt.file_of(name).path().string(), ": unexpected tensor '", name, "' for ",
           c.architecture, " as configured in ", c.path.string());
    }

    // Inverse frequencies exactly as transformers computes them (fp32).
    auto inv = 1.0 / at::pow(c.rope.theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) /
                                               static_cast<double>(d));
    if (c.rope.type == "linear") {
      inv = inv / c.rope.factor;
    } else if (c.rope.type == "llama3") {
      const double factor = c.rope.factor, lo = c.rope.low_freq_factor;
      const double hi = c.rope.high_freq_factor;
      const double old_len = c.rope.original_max_position_embeddings;
      const double low_wavelen = old_len / lo, high_wavelen = old_len / hi;
      auto wavelen = (2 * std::numbers::pi) / inv;
      auto llama = at::where(wavelen > low_wavelen, inv / factor, inv);
      auto smooth = (old_len / wavelen - lo) / (hi - lo);
      auto smoothed = (1 - smooth) * llama / factor + smooth * llama;
      auto medium =
          at::logical_not(wavelen < high_wavelen) & at::logical_not(wavelen > low_wavelen);
      inv = at::where(medium, smoothed, llama);
    }
    impl->inv_freq = inv.to(impl->device);
  } catch (const c10::Error& e) {
    fail("model ", dir.string(), ": torch error: ", e.what_without_backtrace());
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelConfig& Model::config() const { return impl_->cfg; }
const std::filesystem::path& Model::dir() const { return impl_->dir; }
std::string Model::device() const { return impl_->device.str(); }
bool Model::on_cuda() const { return impl_->device.is_cuda(); }

ModelKvCache Model::make_cache(const std::string& spec) const {
  return ModelKvCache(impl_->cfg.kv_geometry(), spec);
}

ForwardResult Model::forward(ModelKvCache& cache, std::span<const std::int32_t> tokens,
                             const ForwardOptions& options) const {
  try {
    return impl_->forward(cache, tokens, options);
  } catch (const c10::Error& e) {
    fail("forward (", impl_->dir.string(), "): torch error: ", e.what_without_backtrace());
  }
}

std::vector<float> Model::prefill(ModelKvCache& cache, std::span<const std::int32_t> tokens) const {
  auto r = forward(cache, tokens);
  return std::vector<float>(r.logits.data(), r.logits.data() + r.logits.size());
}

std::vector<float> Model::decode_step(ModelKvCache& cache, std::int32_t token) const {
  return prefill(cache, std::span<const std::int32_t>(&token, 1));
}

std::vector<std::int32_t> Model::generate_greedy(ModelKvCache& cache,
                                                 std::span<const std::int32_t> prompt, int steps,
                                                 bool stop_at_eos) const {
  std::vector<std::int32_t> out;
  if (steps <= 0) return out;
  auto logits = prefill(cache, prompt);
  const auto& eos = impl_->cfg.eos_token_ids;
  for (int s = 0; s < steps; ++s) {
    const std::int32_t next = argmax(logits);
    out.push_back(next);
    if (stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (s + 1 < steps) logits = decode_step(cache, next);
  }
  return out;
}

int argmax(std::span<const float> logits) {
  KVARN_CHECK(!logits.empty(), "argmax of empty logits");
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace kvarn
