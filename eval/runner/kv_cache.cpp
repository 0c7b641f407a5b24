#include "kvarn/runner/kv_cache.hpp"

#include <algorithm>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#if KVARN_RUNNER_GPU_CACHE
#include "kvarn/cuda/paged_cache.hpp"
#endif

namespace kvarn {

struct ModelKvCache::Device {
#if KVARN_RUNNER_GPU_CACHE
  std::vector<std::unique_ptr<cuda::PagedCache>> layers;
#endif
};

struct ModelKvCache::Head {
  std::unique_ptr<KvCache> method;  // null when exact
  std::vector<float> k, v;          // exact rows [size, D]
  int size = 0;
};

ModelKvCache::ModelKvCache(const KvGeometry& g, KvStorage storage, std::string spec)
    : geometry_(g), storage_(storage), spec_(std::move(spec)) {
  KVARN_CHECK(g.num_layers > 0 && g.num_kv_heads > 0 && g.head_dim > 0,
              "KV cache: invalid geometry (layers ", g.num_layers, ", kv heads ", g.num_kv_heads,
              ", head_dim ", g.head_dim, ")");
  heads_.resize(static_cast<std::size_t>(g.num_layers) * g.num_kv_heads);
  final_rows_.assign(g.num_layers, 0);
}

ModelKvCache ModelKvCache::exact(const KvGeometry& g, bool fp16) {
  return ModelKvCache(g, fp16 ? KvStorage::kExactFp16 : KvStorage::kExactFp32,
                      fp16 ? "exact_fp16" : "exact");
}

ModelKvCache::ModelKvCache(const KvGeometry& g, const std::string& spec)
    : ModelKvCache(g,
                   spec == "exact"        ? KvStorage::kExactFp32
                   : spec == "exact_fp16" ? KvStorage::kExactFp16
                                          : KvStorage::kMethod,
                   spec) {
  if (storage_ == KvStorage::kMethod) init_method(*make_method(spec));
}

ModelKvCache::ModelKvCache(const KvGeometry& g, const Method& method)
    : ModelKvCache(g, KvStorage::kMethod, method.spec()) {
  init_method(method);
}

void ModelKvCache::init_method(const Method& method) {
  method.check_head_dim(geometry_.head_dim);
  for (int l = 0; l < geometry_.num_layers; ++l) {
    for (int h = 0; h < geometry_.num_kv_heads; ++h) {
      head(l, h).method =
          method.make_cache(geometry_.head_dim, LayerContext{l, geometry_.num_layers});
    }
  }
}

void ModelKvCache::set_placement(KvPlacement placement) {
  KVARN_CHECK(size() == 0 && placement_note_.empty(), "KV cache '", spec_,
              "': set_placement must come before the first append");
  placement_ = placement;
}

std::string ModelKvCache::device_unsupported() const {
  if (storage_ != KvStorage::kMethod) return "exact storage stays on the host";
#if KVARN_RUNNER_GPU_CACHE
  std::string why;
  cuda::paged_cache_config_of(*make_method(spec_), geometry_.num_kv_heads, geometry_.head_dim,
                              nullptr, &why);
  return why;
#else
  return "the runner was built without kvarn_cuda";
#endif
}

void ModelKvCache::bind_device(int device_index) {
  KVARN_CHECK(size() == 0 && placement_note_.empty(), "KV cache '", spec_,
              "': only an empty, undecided cache can move to the GPU");
  KVARN_CHECK(placement_ != KvPlacement::kHost, "KV cache '", spec_, "' is pinned to the host");
  const std::string why = device_unsupported();
  KVARN_CHECK(why.empty(), "KV cache '", spec_, "': no GPU paged cache: ", why);
#if KVARN_RUNNER_GPU_CACHE
  auto dev = std::make_unique<Device>();
  cuda::PagedCacheConfig cfg;
  cuda::paged_cache_config_of(*make_method(spec_), geometry_.num_kv_heads, geometry_.head_dim, &cfg,
                              nullptr);
  int prev = 0;
  KVARN_CUDA_CHECK(cudaGetDevice(&prev));
  if (device_index < 0) device_index = prev;  // "cuda": the current device
  KVARN_CUDA_CHECK(cudaSetDevice(device_index));
  for (int l = 0; l < geometry_.num_layers; ++l)
    dev->layers.push_back(std::make_unique<cuda::PagedCache>(cfg));
  KVARN_CUDA_CHECK(cudaSetDevice(prev));
  device_ = std::move(dev);
  heads_.clear();  // the CPU caches are never used
  placement_ = KvPlacement::kDevice;
  placement_note_ = "KV cache '" + spec_ +
                    "': GPU paged cache on cuda:" + std::to_string(device_index) +
                    " (store kernel + fused paged decode)";
#else
  (void)device_index;
#endif
}

void ModelKvCache::bind_host(const std::string& why) {
  KVARN_CHECK(placement_ != KvPlacement::kDevice, "KV cache '", spec_,
              "': placement kDevice but no GPU paged cache: ", why);
  if (!placement_note_.empty()) return;
  placement_ = KvPlacement::kHost;
  placement_note_ = "KV cache '" + spec_ + "': host cache" + (why.empty() ? "" : " (" + why + ")");
}

void ModelKvCache::decide_host_on_first_append() {
  if (placement_note_.empty()) bind_host("rows appended from the host");
}

void ModelKvCache::require_host(const char* what) const {
  KVARN_CHECK(!on_device(), "KV cache '", spec_, "': ", what,
              " reads host rows, but this cache lives on the GPU; call "
              "set_placement(KvPlacement::kHost) before the first forward to keep it on the host");
}

cuda::PagedCache* ModelKvCache::device_layer(int layer) const {
  KVARN_CHECK(layer >= 0 && layer < geometry_.num_layers, "KV cache: layer ", layer,
              " out of range");
#if KVARN_RUNNER_GPU_CACHE
  if (on_device()) return device_->layers[layer].get();
#endif
  return nullptr;
}

ModelKvCache::~ModelKvCache() = default;
ModelKvCache::ModelKvCache(ModelKvCache&&) noexcept = default;
ModelKvCache& ModelKvCache::operator=(ModelKvCache&&) noexcept = default;

ModelKvCache::Head& ModelKvCache::head(int layer, int h) {
  KVARN_CHECK(layer >= 0 && layer < geometry_.num_layers && h >= 0 && h < geometry_.num_kv_heads,
              "KV cache: (layer ", layer, ", head ", h, ") out of range (", geometry_.num_layers,
              " layers, ", geometry_.num_kv_heads, " KV heads)");
  return heads_[static_cast<std::size_t>(layer) * geometry_.num_kv_heads + h];
}

const ModelKvCache::Head& ModelKvCache::head(int layer, int h) const {
  return const_cast<ModelKvCache*>(this)->head(layer, h);
}

int ModelKvCache::size(int layer) const {
#if KVARN_RUNNER_GPU_CACHE
  if (on_device()) return device_layer(layer)->size();
#endif
  return head(layer, 0).size;
}

void ModelKvCache::append(int layer, const float* k, const float* v, int n) {
  KVARN_CHECK(n >= 0, "KV cache: negative token count ", n);
#if KVARN_RUNNER_GPU_CACHE
  if (on_device()) {
    device_layer(layer)->append_host(k, v, n);
    return;
  }
#endif
  decide_host_on_first_append();
  const std::size_t d = geometry_.head_dim;
  const std::size_t block = static_cast<std::size_t>(n) * d;
  for (int h = 0; h < geometry_.num_kv_heads; ++h) {
    Head& hd = head(layer, h);
    const float* kh = k + h * block;
    const float* vh = v + h * block;
    if (hd.method) {
      hd.method->append(kh, vh, n);
    } else {
      check_finite(kh, n, static_cast<int>(d),
                   "keys of layer " + std::to_string(layer) + " head " + std::to_string(h));
      check_finite(vh, n, static_cast<int>(d),
                   "values of layer " + std::to_string(layer) + " head " + std::to_string(h));
      hd.k.insert(hd.k.end(), kh, kh + block);
      hd.v.insert(hd.v.end(), vh, vh + block);
      if (storage_ == KvStorage::kExactFp16) {
        for (std::size_t i = hd.k.size() - block; i < hd.k.size(); ++i) {
          hd.k[i] = half_bits_to_float(float_to_half_bits(hd.k[i]));
          hd.v[i] = half_bits_to_float(float_to_half_bits(hd.v[i]));
        }
      }
    }
    hd.size += n;
  }
  // Advance the final prefix: a row is final once neither stream can rewrite it.
  int t = final_rows_[layer];
  const int size = head(layer, 0).size;
  if (storage_ != KvStorage::kMethod) {
    t = size;
  } else {
    for (; t < size; ++t) {
      bool fixed = true;
      for (int h = 0; h < geometry_.num_kv_heads && fixed; ++h) {
        const KvCache& c = *head(layer, h).method;
        for (StreamKind kind : {StreamKind::kKey, StreamKind::kValue}) {
          fixed = fixed && (t < c.codec(kind).policy().sink || c.quantized(kind, t));
        }
      }
      if (!fixed) break;
    }
  }
  final_rows_[layer] = t;
}

MatrixMap ModelKvCache::keys(int layer, int h) const {
  require_host("keys()");
  const Head& hd = head(layer, h);
  if (hd.method) return hd.method->keys();
  return MatrixMap(hd.k.data(), hd.size, geometry_.head_dim);
}

MatrixMap ModelKvCache::values(int layer, int h) const {
  require_host("values()");
  const Head& hd = head(layer, h);
  if (hd.method) return hd.method->values();
  return MatrixMap(hd.v.data(), hd.size, geometry_.head_dim);
}

const KvCache* ModelKvCache::method_cache(int layer, int h) const {
  require_host("method_cache()");
  return head(layer, h).method.get();
}

bool ModelKvCache::quantized(int layer, int h, StreamKind kind, int token) const {
#if KVARN_RUNNER_GPU_CACHE
  if (on_device()) {
    KVARN_CHECK(h >= 0 && h < geometry_.num_kv_heads, "KV cache: head ", h, " out of range");
    (void)kind;  // both streams share the policy of every GPU format
    return device_layer(layer)->quantized(token);
  }
#endif
  const Head& hd = head(layer, h);
  KVARN_CHECK(token >= 0 && token < hd.size, "KV cache: token ", token, " out of range (", hd.size,
              " tokens)");
  return hd.method ? hd.method->quantized(kind, token) : false;
}

std::size_t ModelKvCache::stored_bytes() const {
  std::size_t bytes = 0;
#if KVARN_RUNNER_GPU_CACHE
  if (on_device()) {
    for (const auto& l : device_->layers) bytes += l->stored_bytes();
    return bytes;
  }
#endif
  const std::size_t elem = storage_ == KvStorage::kExactFp16 ? 2 : 4;
  for (const Head& hd : heads_) {
    bytes += hd.method ? hd.method->stored_bytes()
                       : 2 * elem * static_cast<std::size_t>(hd.size) * geometry_.head_dim;
  }
  return bytes;
}

int ModelKvCache::final_rows(int layer) const {
  KVARN_CHECK(layer >= 0 && layer < geometry_.num_layers, "KV cache: layer ", layer,
              " out of range");
  if (on_device()) return size(layer);  // no host rows to re-upload
  return final_rows_[layer];
}

}  // namespace kvarn
