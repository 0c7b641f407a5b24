// The KV cache of a whole model: one cache per (layer, KV head), holding either exact K/V (fp32,
// or rounded to fp16 as an fp16 cache would store them) or a kvarn::KvCache of any registry
// method, built with Method::make_cache(head_dim, {layer, num_layers}) so that every method's
// policy applies unchanged: fp16 sink + quantized chunks + fp16 tail (KVarN), KIVI residual
// windows, TurboQuant fp16 boundary layers. Attention always reads keys()/values(): the exact
// rows or the method's reconstruction. The runner appends post-RoPE keys.
//
// This header is torch-free; the runner keeps a device copy of the rows (see final_rows()).
#ifndef KVARN_EVAL_KV_CACHE_HPP_
#define KVARN_EVAL_KV_CACHE_HPP_

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
  void append(int layer, const float* k, const float* v, int n);
  // [size, head_dim] rows attention reads (exact, or the method's reconstruction).
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
  std::vector<int> final_rows_;
  std::shared_ptr<void> runner_state_;
};

}  // namespace kvarn

#endif  // KVARN_EVAL_KV_CACHE_HPP_
