// GPU-resident paged KV cache of one layer (Hkv heads of one sequence), plain C++ host API.
//
// KVarN: the method's policy on the GPU. Logical block j holds tokens [j G, (j + 1) G); block j
//   is physical block j. Sink blocks (S = cfg.sink(), a multiple of G) and unfinished blocks live
//   in the fp16 pool (rotated frame, written by kvarn_append); a non-sink block is sealed into a
//   KVarN record by kvarn_store as soon as it is complete, and its pool slot is freed. The store
//   reads the un-rotated fp16 rows of the unsealed blocks, kept in a small raw buffer.
// FP16 / FP8 (e4m3, one fixed per-tensor scale as core's `fp8:scale=s`): pages
//   [blocks, Hkv, P, D], every token written on arrival (chunk 1).
// Reads go through paged_decode: query i of attend() is one batch row over the same block table
//   with seq_len = positions[i] + 1 (causal per query).
//
// append() = stage() + commit(). stage() writes the rows where attention sees them (pool/pages)
// without sealing; commit() seals complete tiles. attend() between the two lets a chunk see its
// own rows in fp16 before they are quantized (the runner's ChunkAttention::kExact).
// Everything is asynchronous on the cache's stream; device memory is owned (RAII) and grows
// geometrically. Inputs: k, v device fp16 bits [Hkv, n, D] (post-RoPE, not rotated: the kernels
// rotate); q device fp16 [n, Hq, D]; out device fp16 [n, Hq, D] (original frame).
#ifndef KVARN_CUDA_PAGED_CACHE_HPP_
#define KVARN_CUDA_PAGED_CACHE_HPP_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/method.hpp"
#include "kvarn/cuda/api.hpp"

namespace kvarn::cuda {

enum class CacheFormat { kKvarn, kFp16, kFp8 };

struct PagedCacheConfig {
  CacheFormat format = CacheFormat::kKvarn;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvarnConfig kvarn;       // KVarN only
  int page = 128;          // FP16 / FP8 page (32, 64, 128)
  float fp8_scale = 1.0f;  // FP8: stored = e4m3(x / scale), as core's fixed-scale fp8 method
};

// Why the GPU cannot hold this configuration ("" when it can): the store/decode limits
// (D 64/128, G 32/64/128, Hadamard or no rotation, quantile 0, compiled bit pairs, record
// alignment, sink a multiple of G), page sizes.
std::string paged_cache_unsupported(const PagedCacheConfig& cfg);
// The config of a registry method, or the reason it has none ("" in `why` when it has one):
// family kvarn, fp16, fp8 (fixed scale, e4m3); everything else stays on the CPU.
bool paged_cache_config_of(const Method& method, int num_kv_heads, int head_dim,
                           PagedCacheConfig* cfg, std::string* why);

class PagedCache {
 public:
  // Throws kvarn::Error (paged_cache_unsupported's reason) for an unsupported config.
  explicit PagedCache(const PagedCacheConfig& cfg, cudaStream_t stream = nullptr);
  ~PagedCache();
  PagedCache(const PagedCache&) = delete;
  PagedCache& operator=(const PagedCache&) = delete;

  const PagedCacheConfig& config() const { return cfg_; }
  cudaStream_t stream() const { return stream_; }
  int size() const { return size_; }  // tokens written (staged ones included)

  void append(const std::uint16_t* k, const std::uint16_t* v, int n);
  void stage(const std::uint16_t* k, const std::uint16_t* v, int n);
  void commit();
  // Host fp32 rows [Hkv, n, D], rounded to fp16 (RNE) and uploaded; then append().
  void append_host(const float* k, const float* v, int n);

  // out[i] = attention of q[i] over tokens [0, positions[i]] (positions[i] < size()).
  void attend(const std::uint16_t* q, int num_q_heads, std::span<const int> positions,
              std::uint16_t* out);

  // Whether token t is stored quantized, as core's KvCache::quantized: a sealed KVarN record;
  // every FP16 / FP8 token (chunk-1 codecs).
  bool quantized(int token) const;
  int sealed_blocks() const { return sealed_; }
  // Bytes the layout holds for the tokens: records + fp16 rows (KVarN), pages' used rows.
  std::size_t stored_bytes() const;
  std::size_t device_bytes() const;  // allocated

 private:
  struct Buffer {  // raw device bytes
    void* p = nullptr;
    std::size_t bytes = 0;
    ~Buffer();
    void grow(std::size_t need, cudaStream_t s, bool keep);  // keep: copy the old prefix
    template <class T>
    T* as() const {
      return static_cast<T*>(p);
    }
  };
  int group() const;              // KVarN G or the page size
  std::size_t row_bytes() const;  // one stored row of one head (fp16 pool/page, fp8 page)
  void reserve_blocks(int blocks);
  int take_slot();
  void upload_slots();
  void grow_raw(int tokens);

  PagedCacheConfig cfg_;
  cudaStream_t stream_;
  int device_ = 0;
  int size_ = 0;
  int blocks_cap_ = 0;
  std::size_t record_bytes_ = 0;
  // KVarN: records [blocks, Hkv, rec], pool [slots, Hkv, G, D] (FP16/FP8: the pages), raw
  // un-rotated rows [Hkv, raw_cap, D] of tokens [raw_first, size) (unsealed, after the sink)
  Buffer records_, k_pool_, v_pool_, slot_map_, raw_k_, raw_v_, scratch_, pool_pos_;
  int slots_cap_ = 0, slots_used_ = 0, raw_cap_ = 0, raw_first_ = 0, sealed_ = 0;
  std::vector<int> block_to_slot_, free_slots_;
  Buffer scales_;  // FP8 [Hkv] (K and V share core's one scale)
  // decode
  Buffer table_, seq_lens_, workspace_, host_rows_;
  int table_rows_ = 0, table_stride_ = 0;
};

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_PAGED_CACHE_HPP_
