// The KV cache of a whole model: one cache per (layer, KV head), holding either exact K/V (fp32,
// or rounded to fp16 as an fp16 cache would store them) or a kvarn::KvCache of any registry
// method, built with Method::make_cache(head_dim, {layer, num_layers}) so that every method's
// policy applies unchanged: fp16 sink + quantized chunks + fp16 tail (KVarN), KIVI residual
// windows, TurboQuant fp16 boundary layers. Attention always reads keys()/values(): the exact
// rows or the method's reconstruction. The runner appends post-RoPE keys.
//
// Placement: on a CUDA model the runner keeps supported methods (KVarN configs the GPU kernels
// take, fp16, fixed-scale fp8 e4m3) in GPU paged caches (kvarn/cuda/paged_cache.hpp, one per
// layer) written by the store kernel and read by the fused paged decode; everything else lives on
// the host as above, with a device copy of the rows (see final_rows()). docs/runner.md.
//
// This header is torch-free.
#ifndef KVARN_RUNNER_KV_CACHE_HPP_
#define KVARN_RUNNER_KV_CACHE_HPP_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/core/method.hpp"

namespace kvarn {

struct KvGeometry {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

namespace cuda {
class PagedCache;
}

// Where a method cache's rows live. kAuto: decided at the first forward into the empty cache
// (GPU paged cache when the model is on CUDA and the GPU supports the method, else the host);
// kHost: always the CPU reference cache; kDevice: the GPU paged cache or an error.
enum class KvPlacement { kAuto, kHost, kDevice };

enum class KvStorage {
  kExactFp32,  // rows stored as computed
  kExactFp16,  // rows rounded to fp16 (RNE, as an fp16 cache)
  kMethod,     // a registry method in the loop (quantize on write)
};

class ModelKvCache {
 public:
  // `spec`: "exact" (fp32), "exact_fp16", or any registry name/spec ("fp16", "kivi_2bit",
  // "kvarn_k4v2_g64", "kvarn:k=3,v=2,g=64", ...). Throws kvarn::Error for unknown methods or a
  // head_dim the method does not support.
  ModelKvCache(const KvGeometry& geometry, const std::string& spec);
  ModelKvCache(const KvGeometry& geometry, const Method& method);
  static ModelKvCache exact(const KvGeometry& geometry, bool fp16 = false);
  ~ModelKvCache();
  ModelKvCache(ModelKvCache&&) noexcept;
  ModelKvCache& operator=(ModelKvCache&&) noexcept;
  ModelKvCache(const ModelKvCache&) = delete;
  ModelKvCache& operator=(const ModelKvCache&) = delete;

  const KvGeometry& geometry() const { return geometry_; }
  KvStorage storage() const { return storage_; }
  const std::string& spec() const { return spec_; }
  // Tokens held by layer 0 (every layer holds the same number between forward calls).
  int size() const { return size(0); }
  int size(int layer) const;

  // Appends n tokens of one layer: k and v are [num_kv_heads, n, head_dim] (C order), finite.
  // On a GPU-resident cache the rows are rounded to fp16 and uploaded.
  void append(int layer, const float* k, const float* v, int n);
  // [size, head_dim] rows attention reads (exact, or the method's reconstruction). Host caches
  // only (as method_cache, quantized): a GPU-resident cache throws, naming set_placement.
  MatrixMap keys(int layer, int head) const;
  MatrixMap values(int layer, int head) const;
  // The method's cache of one (layer, head), for chunk/byte inspection; nullptr when exact.
  const KvCache* method_cache(int layer, int head) const;
  // Whether a token's row is stored quantized (false in exact caches, sinks, tails, windows).
  bool quantized(int layer, int head, StreamKind kind, int token) const;
  // Bytes the cache stores: exact fp16 = 2 bytes/element, exact fp32 = 4, methods as measured.
  std::size_t stored_bytes() const;
  // Rows [0, final_rows(layer)) of every head of a layer will never change again (exact rows,
  // sinks, flushed chunks); later rows are pending and may be rewritten when their chunk is
  // quantized. The runner re-uploads only rows from here on.
  int final_rows(int layer) const;

  // Placement (set before the first append). Once decided, placement() is kHost or kDevice.
  void set_placement(KvPlacement placement);
  KvPlacement placement() const { return placement_; }
  bool on_device() const { return placement_ == KvPlacement::kDevice && device_ != nullptr; }
  // Why this cache cannot live on the GPU ("" when it can): exact storage, the method's family
  // or a configuration the kernels lack, or a runner built without kvarn_cuda.
  std::string device_unsupported() const;
  // What was decided and why (one line, for logs); empty while undecided.
  const std::string& placement_note() const { return placement_note_; }
  // Runner hooks: move an empty undecided cache to the GPU (CUDA device index; throws with the
  // reason when unsupported) or pin it to the host, noting why.
  void bind_device(int device_index);
  void bind_host(const std::string& why);
  // The GPU cache of a layer (nullptr unless on_device()).
  cuda::PagedCache* device_layer(int layer) const;

  // Opaque per-cache state of the runner (the device copy); not for other users.
  std::shared_ptr<void>& runner_state() { return runner_state_; }

 private:
  struct Head;
  ModelKvCache(const KvGeometry& geometry, KvStorage storage, std::string spec);
  void init_method(const Method& method);
  Head& head(int layer, int h);
  const Head& head(int layer, int h) const;

  KvGeometry geometry_;
  KvStorage storage_ = KvStorage::kExactFp32;
  std::string spec_;
  std::vector<Head> heads_;  // [layer * num_kv_heads + head]
  void decide_host_on_first_append();
  void require_host(const char* what) const;

  std::vector<int> final_rows_;
  std::shared_ptr<void> runner_state_;
  KvPlacement placement_ = KvPlacement::kAuto;
  std::string placement_note_;
  struct Device;  // per-layer GPU caches (kv_cache.cpp)
  std::unique_ptr<Device> device_;
};

}  // namespace kvarn

#endif  // KVARN_RUNNER_KV_CACHE_HPP_
