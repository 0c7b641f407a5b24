// PagedCache: block bookkeeping on the host, data on the device (paged_cache.hpp).
#include "kvarn/cuda/paged_cache.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>

#include "kvarn/core/fp8.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/cuda/decode_instances.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn::cuda {

namespace detail {
// paged_cache.cu
void launch_page_scatter(bool fp8, const std::uint16_t* k, const std::uint16_t* v, int n, int first,
                         int num_kv_heads, int d, int page, float scale, void* k_pages,
                         void* v_pages, cudaStream_t stream);
}  // namespace detail

namespace {

// KVarN bit pairs paged_decode instantiates (decode_kvarn_k4.cu, decode_kvarn_other.cu).

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream o;
  (o << ... << a);
  return o.str();
}

bool decode_group(int g) { return g == 32 || g == 64 || g == 128; }

// Runs the calls of one method on the cache's device, restoring the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    KVARN_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) KVARN_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceScope() {
    if (prev_ != device_) (void)cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0, device_ = 0;
};

void upload(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
  // Pageable source: the call returns once `src` has been consumed, so it may be reused at once.
  if (bytes) KVARN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
}

}  // namespace

std::string paged_cache_unsupported(const PagedCacheConfig& c) {
  if (c.num_kv_heads <= 0) return cat("num_kv_heads ", c.num_kv_heads, " must be > 0");
  if (c.head_dim != 64 && c.head_dim != 128)
    return cat("head_dim ", c.head_dim, " (the GPU kernels take 64 or 128)");
  if (c.format != CacheFormat::kKvarn) {
    if (!decode_group(c.page)) return cat("page ", c.page, " (32, 64 or 128)");
    if (c.format == CacheFormat::kFp8 && !(std::isfinite(c.fp8_scale) && c.fp8_scale > 0))
      return cat("fp8 scale ", c.fp8_scale, " must be a positive number");
    return "";
  }
  const KvarnConfig& k = c.kvarn;
  if (!decode_group(k.group)) return cat("KVarN group ", k.group, " (decode takes 32, 64, 128)");
  if (k.rotation == RotationKind::kHaar)
    return cat("KVarN rotation ", kvarn_rotation_name(k.rotation), " (Hadamard or none)");
  if (k.rtn_quantile != 0.0f) return cat("KVarN RTN quantile ", k.rtn_quantile, " (0 only)");
  if (!decode_compiled(DecodeFormat::kKvarn, k.key_bits, k.value_bits))
    return cat("KVarN k", k.key_bits, "v", k.value_bits, " (decode compiles ",
               decode_compiled_list(DecodeFormat::kKvarn), ")");
  if (k.recent != 0)
    return cat("KVarN recent window ", k.recent,
               " (the GPU cache seals every full non-sink block; recent=0 only)");
  if (k.sink() % k.group != 0)
    return cat("KVarN sink ", k.sink(), " is not a multiple of the group ", k.group,
               " (GPU blocks are whole groups)");
  const KvarnRecordLayout lay = kvarn_record_layout(c.head_dim, k);
  if (lay.aligned % 16 != 0 || lay.s_col_k % 32 != 0 || lay.v_codes % 32 != 0)
    return "KVarN record layout not 16/32-byte aligned for the decode kernel";
  return "";
}

bool paged_cache_config_of(const Method& method, int num_kv_heads, int head_dim,
                           PagedCacheConfig* cfg, std::string* why) {
  PagedCacheConfig c;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  std::string reason;
  if (const auto* kv = dynamic_cast<const KvarnMethod*>(&method)) {
    c.format = CacheFormat::kKvarn;
    c.kvarn = kv->config();
  } else if (const auto* f8 = dynamic_cast<const Fp8Method*>(&method)) {
    const Fp8Config& fc = f8->config();
    c.format = CacheFormat::kFp8;
    c.fp8_scale = static_cast<float>(fc.scale);
    if (fc.format != Fp8Format::kE4M3) reason = "fp8 e5m2 (decode reads e4m3 only)";
    if (fc.calibrated) reason = "fp8 with a calibrated scale (fixed scales only)";
  } else if (method.family() == "fp16") {
    c.format = CacheFormat::kFp16;
  } else {
    reason = "method family " + method.family() + " has no GPU cache (kvarn, fp16, fp8 only)";
  }
  if (reason.empty()) reason = paged_cache_unsupported(c);
  if (why) *why = reason;
  if (reason.empty() && cfg) *cfg = c;
  return reason.empty();
}

// ---- Buffer ----

PagedCache::Buffer::~Buffer() {
  if (p) (void)cudaFree(p);
}

void PagedCache::Buffer::grow(std::size_t need, cudaStream_t s, bool keep) {
  if (need <= bytes) return;
  void* q = nullptr;
  KVARN_CUDA_CHECK(cudaMalloc(&q, need));
  if (keep && bytes) KVARN_CUDA_CHECK(cudaMemcpyAsync(q, p, bytes, cudaMemcpyDeviceToDevice, s));
  if (p) KVARN_CUDA_CHECK(cudaFree(p));  // synchronizes: the copy above has finished
  p = q;
  bytes = need;
}

// ---- PagedCache ----

PagedCache::PagedCache(const PagedCacheConfig& cfg, cudaStream_t stream)
    : cfg_(cfg), stream_(stream) {
  const std::string why = paged_cache_unsupported(cfg);
  KVARN_CHECK(why.empty(), "paged cache: unsupported on the GPU: ", why);
  KVARN_CUDA_CHECK(cudaGetDevice(&device_));
  if (cfg_.format == CacheFormat::kKvarn) {
    record_bytes_ = kvarn_record_layout(cfg_.head_dim, cfg_.kvarn).aligned;
    raw_first_ = cfg_.kvarn.sink();
  }
  if (cfg_.format == CacheFormat::kFp8) {
    const std::vector<float> s(cfg_.num_kv_heads, cfg_.fp8_scale);
    scales_.grow(s.size() * sizeof(float), stream_, false);
    upload(scales_.p, s.data(), s.size() * sizeof(float), stream_);
  }
}

PagedCache::~PagedCache() {
  // Pending work may still read the buffers: finish it before they are freed.
  (void)cudaStreamSynchronize(stream_);
}

int PagedCache::group() const {
  return cfg_.format == CacheFormat::kKvarn ? cfg_.kvarn.group : cfg_.page;
}

std::size_t PagedCache::row_bytes() const {
  return static_cast<std::size_t>(cfg_.head_dim) * (cfg_.format == CacheFormat::kFp8 ? 1 : 2);
}

void PagedCache::reserve_blocks(int blocks) {
  if (blocks <= blocks_cap_) return;
  const int cap = std::max({blocks, 2 * blocks_cap_, 4});
  const std::size_t h = cfg_.num_kv_heads;
  if (cfg_.format == CacheFormat::kKvarn) {
    records_.grow(cap * h * record_bytes_, stream_, true);
    block_to_slot_.resize(cap, -1);
    slot_map_.grow(cap * sizeof(int), stream_, false);
  } else {
    const std::size_t page_bytes = h * group() * row_bytes();
    k_pool_.grow(cap * page_bytes, stream_, true);
    v_pool_.grow(cap * page_bytes, stream_, true);
  }
  blocks_cap_ = cap;
}

int PagedCache::take_slot() {
  if (!free_slots_.empty()) {
    const int s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  if (slots_used_ == slots_cap_) {
    slots_cap_ = std::max(2, 2 * slots_cap_);
    const std::size_t slot_bytes =
        static_cast<std::size_t>(cfg_.num_kv_heads) * group() * row_bytes();
    k_pool_.grow(slots_cap_ * slot_bytes, stream_, true);
    v_pool_.grow(slots_cap_ * slot_bytes, stream_, true);
  }
  return slots_used_++;
}

void PagedCache::upload_slots() {
  upload(slot_map_.p, block_to_slot_.data(), block_to_slot_.size() * sizeof(int), stream_);
}

void PagedCache::grow_raw(int tokens) {
  if (tokens <= raw_cap_) return;
  const int cap = std::max({tokens, 2 * raw_cap_, group()});
  const std::size_t h = cfg_.num_kv_heads, rb = row_bytes();
  const int held = std::max(0, size_ - raw_first_);
  for (Buffer* b : {&raw_k_, &raw_v_}) {
    Buffer fresh;
    fresh.grow(h * cap * rb, stream_, false);
    if (held > 0)
      KVARN_CUDA_CHECK(cudaMemcpy2DAsync(fresh.p, cap * rb, b->p, raw_cap_ * rb, held * rb, h,
                                         cudaMemcpyDeviceToDevice, stream_));
    std::swap(b->p, fresh.p);
    std::swap(b->bytes, fresh.bytes);
  }  // `fresh` frees the old buffer (cudaFree synchronizes after the copy)
  raw_cap_ = cap;
}

void PagedCache::append(const std::uint16_t* k, const std::uint16_t* v, int n) {
  stage(k, v, n);
  commit();
}

void PagedCache::stage(const std::uint16_t* k, const std::uint16_t* v, int n) {
  KVARN_CHECK(n >= 0, "paged cache: negative token count ", n);
  if (n == 0) return;
  KVARN_CHECK(k != nullptr && v != nullptr, "paged cache: null K/V rows");
  DeviceScope scope(device_);
  const int g = group(), h = cfg_.num_kv_heads, d = cfg_.head_dim;
  const int first = size_, last = size_ + n;
  reserve_blocks((last + g - 1) / g);
  if (cfg_.format != CacheFormat::kKvarn) {
    detail::launch_page_scatter(cfg_.format == CacheFormat::kFp8, k, v, n, first, h, d, g,
                                cfg_.fp8_scale, k_pool_.p, v_pool_.p, stream_);
    size_ = last;
    return;
  }
  // Pool slots for every block the new tokens touch (sinks and unsealed blocks).
  bool new_slots = false;
  for (int b = first / g; b < (last + g - 1) / g; ++b) {
    if (block_to_slot_[b] < 0) {
      block_to_slot_[b] = take_slot();
      new_slots = true;
    }
  }
  if (new_slots) upload_slots();
  std::vector<long long> pos(n);
  for (int i = 0; i < n; ++i) {
    const int t = first + i;
    pos[i] = static_cast<long long>(block_to_slot_[t / g]) * g + t % g;
  }
  pool_pos_.grow(n * sizeof(long long), stream_, false);
  upload(pool_pos_.p, pos.data(), n * sizeof(long long), stream_);
  // kvarn_append takes token-major rows [n, Hkv, D]: transpose the head-major input.
  const std::size_t rb = row_bytes(), plane = static_cast<std::size_t>(n) * h * d;
  scratch_.grow(2 * plane * sizeof(std::uint16_t), stream_, false);
  auto* sk = scratch_.as<std::uint16_t>();
  auto* sv = sk + plane;
  for (int hh = 0; hh < h; ++hh) {
    const std::size_t off = static_cast<std::size_t>(hh) * n * d;
    KVARN_CUDA_CHECK(cudaMemcpy2DAsync(sk + hh * d, h * rb, k + off, rb, rb, n,
                                       cudaMemcpyDeviceToDevice, stream_));
    KVARN_CUDA_CHECK(cudaMemcpy2DAsync(sv + hh * d, h * rb, v + off, rb, rb, n,
                                       cudaMemcpyDeviceToDevice, stream_));
  }
  kvarn_append(cfg_.kvarn, d, n, h, sk, sv, pool_pos_.as<long long>(), k_pool_.as<std::uint16_t>(),
               v_pool_.as<std::uint16_t>(), stream_);
  // Un-rotated rows of the tokens after the sink: the store's input once their block is full.
  const int from = std::max(first, raw_first_);
  if (from < last) {
    grow_raw(last - raw_first_);
    const std::size_t dst = static_cast<std::size_t>(from - raw_first_) * d;
    const std::size_t src = static_cast<std::size_t>(from - first) * d;
    for (auto [raw, in] :
         {std::pair{raw_k_.as<std::uint16_t>(), k}, std::pair{raw_v_.as<std::uint16_t>(), v}}) {
      KVARN_CUDA_CHECK(cudaMemcpy2DAsync(raw + dst, raw_cap_ * rb, in + src, n * rb,
                                         (last - from) * rb, h, cudaMemcpyDeviceToDevice, stream_));
    }
  }
  size_ = last;
}

void PagedCache::commit() {
  if (cfg_.format != CacheFormat::kKvarn) return;
  const int g = group(), h = cfg_.num_kv_heads, d = cfg_.head_dim;
  const int full_end = size_ / g * g;
  if (raw_first_ >= full_end) return;
  DeviceScope scope(device_);
  const int first_block = raw_first_ / g, sealed = (full_end - raw_first_) / g;
  const std::size_t rb = row_bytes();
  StoreTiles t;
  t.k = raw_k_.as<std::uint16_t>();
  t.v = raw_v_.as<std::uint16_t>();
  t.num_tiles = sealed * h;
  t.num_heads = h;
  t.block_stride = static_cast<long long>(g) * d;
  t.head_stride = static_cast<long long>(raw_cap_) * d;
  t.row_stride = d;
  t.dst_block = nullptr;  // identity from first_block on
  t.records =
      records_.as<std::uint8_t>() + static_cast<std::size_t>(first_block) * h * record_bytes_;
  kvarn_store(cfg_.kvarn, d, t, stream_);
  // Keep the unfinished tail at the front of the raw buffer (disjoint ranges: tail < G).
  const int left = size_ - full_end;
  if (left > 0) {
    for (Buffer* b : {&raw_k_, &raw_v_}) {
      auto* p = b->as<std::uint16_t>();
      KVARN_CUDA_CHECK(
          cudaMemcpy2DAsync(p, raw_cap_ * rb, p + static_cast<std::size_t>(sealed) * g * d,
                            raw_cap_ * rb, left * rb, h, cudaMemcpyDeviceToDevice, stream_));
    }
  }
  for (int b = first_block; b < first_block + sealed; ++b) {
    free_slots_.push_back(block_to_slot_[b]);
    block_to_slot_[b] = -1;
  }
  upload_slots();
  raw_first_ = full_end;
  sealed_ += sealed;
}

void PagedCache::append_host(const float* k, const float* v, int n) {
  KVARN_CHECK(n >= 0, "paged cache: negative token count ", n);
  if (n == 0) return;
  const std::size_t elems = static_cast<std::size_t>(n) * cfg_.num_kv_heads * cfg_.head_dim;
  check_finite(k, n * cfg_.num_kv_heads, cfg_.head_dim, "paged cache: keys");
  check_finite(v, n * cfg_.num_kv_heads, cfg_.head_dim, "paged cache: values");
  std::vector<std::uint16_t> h(2 * elems);
  for (std::size_t i = 0; i < elems; ++i) {
    h[i] = float_to_half_bits(k[i]);
    h[elems + i] = float_to_half_bits(v[i]);
  }
  DeviceScope scope(device_);
  host_rows_.grow(h.size() * sizeof(std::uint16_t), stream_, false);
  upload(host_rows_.p, h.data(), h.size() * sizeof(std::uint16_t), stream_);
  append(host_rows_.as<std::uint16_t>(), host_rows_.as<std::uint16_t>() + elems, n);
}

void PagedCache::attend(const std::uint16_t* q, int num_q_heads, std::span<const int> positions,
                        std::uint16_t* out) {
  const int nq = static_cast<int>(positions.size());
  if (nq == 0) return;
  const int g = group();
  KVARN_CHECK(q != nullptr && out != nullptr, "paged cache: null query/output");
  KVARN_CHECK(num_q_heads > 0 && num_q_heads % cfg_.num_kv_heads == 0 &&
                  num_q_heads / cfg_.num_kv_heads <= 8,
              "paged cache: ", num_q_heads, " query heads over ", cfg_.num_kv_heads,
              " KV heads (a multiple, at most 8 per KV head)");
  std::vector<int> lens(nq);
  int max_len = 0;
  for (int i = 0; i < nq; ++i) {
    KVARN_CHECK(positions[i] >= 0 && positions[i] < size_, "paged cache: query ", i,
                " at position ", positions[i], " outside the ", size_, " cached tokens");
    lens[i] = positions[i] + 1;
    max_len = std::max(max_len, lens[i]);
  }
  DeviceScope scope(device_);
  // Block table: logical block j is physical block j; every query row is the same.
  if (nq > table_rows_ || table_stride_ != blocks_cap_) {
    const int rows = std::max(nq, table_rows_);
    std::vector<int> tab(static_cast<std::size_t>(rows) * blocks_cap_);
    for (int r = 0; r < rows; ++r)
      std::iota(tab.begin() + static_cast<std::size_t>(r) * blocks_cap_,
                tab.begin() + static_cast<std::size_t>(r + 1) * blocks_cap_, 0);
    table_.grow(tab.size() * sizeof(int), stream_, false);
    upload(table_.p, tab.data(), tab.size() * sizeof(int), stream_);
    table_rows_ = rows;
    table_stride_ = blocks_cap_;
  }
  seq_lens_.grow(nq * sizeof(int), stream_, false);
  upload(seq_lens_.p, lens.data(), nq * sizeof(int), stream_);

  DecodeProblem p;
  p.format = cfg_.format == CacheFormat::kKvarn  ? DecodeFormat::kKvarn
             : cfg_.format == CacheFormat::kFp16 ? DecodeFormat::kFp16
                                                 : DecodeFormat::kFp8;
  p.batch = nq;
  p.num_q_heads = num_q_heads;
  p.num_kv_heads = cfg_.num_kv_heads;
  p.head_dim = cfg_.head_dim;
  p.block_size = g;
  p.kvarn = cfg_.kvarn;
  p.max_blocks = (max_len + g - 1) / g;  // the split heuristic sees the blocks in use
  p.num_splits = decode_num_splits(p);
  p.warps = decode_num_warps(p);
  p.max_blocks = table_stride_;  // the table's row stride
  workspace_.grow(decode_workspace_bytes(p), stream_, false);
  DecodeBuffers b;
  b.q = q;
  b.out = out;
  b.block_table = table_.as<int>();
  b.seq_lens = seq_lens_.as<int>();
  b.records = records_.as<std::uint8_t>();
  b.block_to_slot = slot_map_.as<int>();
  b.k_pool = k_pool_.p;
  b.v_pool = v_pool_.p;
  b.k_scale = scales_.as<float>();
  b.v_scale = scales_.as<float>();
  b.workspace = workspace_.p;
  paged_decode(p, b, stream_);
}

bool PagedCache::quantized(int token) const {
  KVARN_CHECK(token >= 0 && token < size_, "paged cache: token ", token, " out of range (", size_,
              " tokens)");
  // FP16 / FP8 encode every token on arrival (core's chunk-1 codecs count them as quantized).
  if (cfg_.format != CacheFormat::kKvarn) return true;
  return block_to_slot_[token / group()] < 0;
}

std::size_t PagedCache::stored_bytes() const {
  const std::size_t h = cfg_.num_kv_heads, rows = 2 * row_bytes();  // K + V row
  if (cfg_.format != CacheFormat::kKvarn) return static_cast<std::size_t>(size_) * h * rows;
  const std::size_t kept = size_ - static_cast<std::size_t>(sealed_) * group();
  return sealed_ * h * record_bytes_ + kept * h * rows;
}

std::size_t PagedCache::device_bytes() const {
  std::size_t s = 0;
  for (const Buffer* b : {&records_, &k_pool_, &v_pool_, &slot_map_, &raw_k_, &raw_v_, &scratch_,
                          &pool_pos_, &scales_, &table_, &seq_lens_, &workspace_, &host_rows_})
    s += b->bytes;
  return s;
}

}  // namespace kvarn::cuda
