// Host API of kvarn_cuda (plain C++, usable from .cpp files).
//
// All pointers are device pointers; fp16 tensors are passed as raw uint16 bits. Layouts are
// documented in cuda/src/store.cuh and cuda/src/decode.cuh. Every call is asynchronous on
// `stream`; bad arguments and CUDA errors throw kvarn::Error (a failed launch names its kernel).
#ifndef KVARN_CUDA_API_HPP_
#define KVARN_CUDA_API_HPP_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/cuda/error.hpp"

namespace kvarn::cuda {

// Number of CUDA devices (0 when the runtime or driver is missing); never aborts.
int device_count();

// ---- KVarN store: quantize full tiles into records ----
// The store kernel: one CTA per tile and K or V (kTile), or each of those spread over a cluster
// of 8 CTAs (kCluster); both write the same bytes. kAuto picks by the number of tiles.
enum class StoreKernel { kAuto, kTile, kCluster };

struct StoreTiles {
  const std::uint16_t* k = nullptr;  // fp16 rows, see cuda/src/store.cuh for the strides
  const std::uint16_t* v = nullptr;
  int num_tiles = 0;  // blocks * num_heads
  int num_heads = 1;
  long long block_stride = 0, head_stride = 0, row_stride = 0;  // in elements
  const int* dst_block = nullptr;   // [num_tiles / num_heads] cache block per input block
  std::uint8_t* records = nullptr;  // [num_blocks, num_heads, record_bytes]
  int* overflow = nullptr;  // optional device int, set to 1 when a rotated value is beyond the
                            // fp16 range (the CPU reference rejects such tiles)
  StoreKernel kernel = StoreKernel::kAuto;
};
// Throws unless the config is supported on the GPU (Hadamard power-of-two or no rotation,
// D in {64, 128}, G in {32, 64, 128, 256}, quantile 0).
void kvarn_store(const KvarnConfig& cfg, int head_dim, const StoreTiles& tiles,
                 cudaStream_t stream = nullptr);

// ---- fp16 append of new tokens (rotated) into the sink/tail pool ----
void kvarn_append(const KvarnConfig& cfg, int head_dim, int num_tokens, int num_heads,
                  const std::uint16_t* k, const std::uint16_t* v, const long long* pool_pos,
                  std::uint16_t* k_pool, std::uint16_t* v_pool, cudaStream_t stream = nullptr);

// ---- paged decode attention ----
enum class DecodeFormat { kKvarn, kFp16, kFp8, kTurboQuant };

// TurboQuant (vLLM presets): 4bit_nc = {4, 4, true}, 3bit_nc = {3, 3, true}, k8v4 = {8, 4, false}.
struct TqDecodeConfig {
  int key_bits = 4;    // 3, 4 (Hadamard + Lloyd-Max indices) or 8 (fp8 e4m3, no rotation)
  int value_bits = 4;  // 3, 4
  bool nc = true;      // norm correction (Lloyd-Max keys only)
};
// Bytes of one per-token slot (K idx + fp16 norm | fp8 K, V codes + fp16 scale + fp16 zero,
// rounded up to even): 134 / 102 / 196 at D 128.
int turboquant_slot_bytes(int head_dim, const TqDecodeConfig& c);

struct DecodeProblem {
  DecodeFormat format = DecodeFormat::kKvarn;
  int batch = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int block_size = 128;  // KVarN: cfg.group; FP16/FP8/TurboQuant: page size (TQ: multiple of 16)
  int max_blocks = 0;    // block_table row length
  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  int num_splits = 0;          // 0: automatic
  int warps = 0;      // warps per split CTA, 0: automatic; else a compiled one (decode_num_warps)
  KvarnConfig kvarn;  // KVarN only (bits, group, rotation, scales)
  TqDecodeConfig tq;  // TurboQuant only

  // KVarN G 128: spread the fp16 sink's rows over the splits (1), keep them in one (0), -1: the
  // automatic choice (decode_spread_sink_blocks)
  int spread_sink = -1;
};

struct DecodeBuffers {
  const std::uint16_t* q = nullptr;       // [batch, Hq, D] fp16
  std::uint16_t* out = nullptr;           // [batch, Hq, D] fp16
  const int* block_table = nullptr;       // [batch, max_blocks]
  const int* seq_lens = nullptr;          // [batch]
  const std::uint8_t* records = nullptr;  // KVarN
  const int* block_to_slot = nullptr;     // KVarN [num_blocks], -1: record
  const void* k_pool =
      nullptr;  // KVarN pool / FP16 / FP8 pages / TurboQuant [blocks, Hkv, P, slot]
  const void* v_pool = nullptr;
  const float* k_scale = nullptr;  // FP8 [Hkv]
  const float* v_scale = nullptr;
  void* workspace = nullptr;
};

int decode_num_splits(const DecodeProblem& p);
// Warps per split CTA (a CTA writes one workspace split): KVarN G 128 1 or 2 (p.warps, or the
// automatic choice), KVarN G 64 / FP16 / FP8 2, KVarN G 32 1. TurboQuant: warps per CTA, each
// its own split (kTqCompiledWarps; p.warps, else 8 for 3-/4-bit keys from 2^17 cached tokens
// over sequences x KV heads when eight-warp CTAs reach at least half the SMs, 1 otherwise).
int decode_num_warps(const DecodeProblem& p);
// KVarN G 128: the fp16 sink blocks whose rows the split kernel spreads over the splits, 0 for
// none (p.spread_sink, else the automatic choice; docs/PERFORMANCE.md).
int decode_spread_sink_blocks(const DecodeProblem& p);
std::size_t decode_workspace_bytes(const DecodeProblem& p);
void paged_decode(const DecodeProblem& p, const DecodeBuffers& buf, cudaStream_t stream = nullptr);

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_API_HPP_
