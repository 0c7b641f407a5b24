// Paged decode guards: a failed launch throws kvarn::Error naming the kernel (no abort), pointers
// read 16 bytes at a time must be 16-byte aligned, the block-table walk stops at max_blocks
// whatever seq_lens says, and a bit pair outside the instance table is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/cuda/decode_instances.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {
namespace {

using cuda::DecodeFormat;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaDecodeGuards, LaunchFailureThrowsWithTheKernelName) {
  KVARN_REQUIRE_GPU();
  // grid.z = batch > 65535: the launch itself fails (nothing runs)
  const int batch = 70000, d = 64, g = 32;
  const cuda::DecodeProblem p = decode_problem(DecodeFormat::kFp16, batch, 1, 1, d, g, 1, 1);
  DeviceBuffer<std::uint16_t> q(static_cast<std::size_t>(batch) * d), out(q.size()), pool(g * d);
  DeviceBuffer<int> table(batch), lens(batch);
  DeviceBuffer<std::uint8_t> ws(cuda::decode_workspace_bytes(p));
  cuda::DecodeBuffers b;
  b.q = q.get();
  b.out = out.get();
  b.block_table = table.get();
  b.seq_lens = lens.get();
  b.k_pool = pool.get();
  b.v_pool = pool.get();
  b.workspace = ws.get();
  const std::string what = error_of([&] { cuda::paged_decode(p, b); });
  EXPECT_NE(what.find("paged_decode_kernel"), std::string::npos) << what;
  EXPECT_NE(what.find("cudaError"), std::string::npos) << what;
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());  // the context is still usable
}

TEST(CudaDecodeGuards, MisalignedPoolIsRefused) {
  KVARN_REQUIRE_GPU();
  const cuda::DecodeProblem p = decode_problem(DecodeFormat::kFp16, 1, 1, 1, 64, 32, 1, 1);
  DeviceBuffer<std::uint8_t> pool(4096), ws(cuda::decode_workspace_bytes(p));
  cuda::DecodeBuffers b;
  b.k_pool = pool.get() + 8;
  b.v_pool = pool.get();
  b.workspace = ws.get();
  const std::string what = error_of([&] { cuda::paged_decode(p, b); });
  EXPECT_NE(what.find("k_pool must be 16-byte aligned"), std::string::npos) << what;
}

TEST(CudaDecodeGuards, UncompiledBitPairIsRefusedWithTheTable) {
  KVARN_REQUIRE_GPU();
  ASSERT_FALSE(cuda::decode_compiled(DecodeFormat::kKvarn, 5, 3));
  cuda::DecodeProblem p = decode_problem(DecodeFormat::kKvarn, 1, 1, 1, 128, 128, 1, 1);
  p.kvarn.key_bits = 5;
  p.kvarn.value_bits = 3;
  DeviceBuffer<std::uint8_t> ws(cuda::decode_workspace_bytes(p));
  cuda::DecodeBuffers b;
  b.workspace = ws.get();
  const std::string what = error_of([&] { cuda::paged_decode(p, b); });
  EXPECT_NE(what.find("k5v3 not compiled (" + cuda::decode_compiled_list(DecodeFormat::kKvarn)),
            std::string::npos)
      << what;
}

TEST(CudaDecodeGuards, UncompiledWarpCountIsRefused) {
  KVARN_REQUIRE_GPU();
  static_assert(cuda::decode_table_warps(DecodeFormat::kKvarn, 4, 2) == 1 &&
                    cuda::decode_table_warps(DecodeFormat::kKvarn, 4, 4) == 2 &&
                    cuda::decode_table_warps(DecodeFormat::kKvarn, 5, 3) == 0,
                "the table's G 128 warp counts");
  struct Bad {
    DecodeFormat fmt;
    int g, warps;
  };
  for (const Bad& c : {Bad{DecodeFormat::kKvarn, 128, 3}, Bad{DecodeFormat::kKvarn, 64, 1},
                       Bad{DecodeFormat::kKvarn, 32, 2}, Bad{DecodeFormat::kFp16, 128, 1}}) {
    cuda::DecodeProblem p = decode_problem(c.fmt, 1, 1, 1, 128, c.g, 1, 1);
    p.kvarn.group = c.g;
    p.warps = c.warps;
    DeviceBuffer<std::uint8_t> ws(cuda::decode_workspace_bytes(p));
    cuda::DecodeBuffers b;
    b.workspace = ws.get();
    const std::string what = error_of([&] { cuda::paged_decode(p, b); });
    EXPECT_NE(what.find("paged_decode: warps " + std::to_string(c.warps)), std::string::npos)
        << what;
  }
}

// seq_lens claims more tokens than the block-table row holds: the kernel attends over the
// max_blocks blocks of the row (compute-sanitizer: no read past the row).
TEST(CudaDecodeGuards, BlockWalkStopsAtMaxBlocks) {
  KVARN_REQUIRE_GPU();
  const int d = 64, g = 32, hq = 4, hkv = 2, max_blocks = 3, claimed = 10 * g;
  Rng rng(31);
  std::vector<std::uint16_t> kp(static_cast<std::size_t>(max_blocks) * hkv * g * d), vp(kp.size());
  std::vector<std::vector<float>> kref(hkv), vref(hkv);
  for (std::size_t i = 0; i < kp.size(); ++i) {
    kp[i] = float_to_half_bits(static_cast<float>(rng.normal()));
    vp[i] = float_to_half_bits(static_cast<float>(rng.normal()));
  }
  const std::vector<int> table = {2, 0, 1};
  for (int h = 0; h < hkv; ++h)
    for (int j = 0; j < max_blocks; ++j)
      for (int t = 0; t < g * d; ++t) {
        const std::size_t at = (static_cast<std::size_t>(table[j]) * hkv + h) * g * d + t;
        kref[h].push_back(half_bits_to_float(kp[at]));
        vref[h].push_back(half_bits_to_float(vp[at]));
      }
  std::vector<std::uint16_t> q(static_cast<std::size_t>(hq) * d);
  for (auto& x : q) x = float_to_half_bits(static_cast<float>(rng.normal()));
  const auto ref = decode_reference(q, 1, hq, hkv, d, kref, vref, {max_blocks * g});
  DeviceBuffer<std::uint16_t> dq(q), dout(q.size()), dk(kp), dv(vp);
  DeviceBuffer<int> dtable(table), dlens(std::vector<int>{claimed});
  const cuda::DecodeProblem p = decode_problem(DecodeFormat::kFp16, 1, hq, hkv, d, g, max_blocks);
  DeviceBuffer<std::uint8_t> ws(cuda::decode_workspace_bytes(p));
  cuda::DecodeBuffers b;
  b.q = dq.get();
  b.out = dout.get();
  b.block_table = dtable.get();
  b.seq_lens = dlens.get();
  b.k_pool = dk.get();
  b.v_pool = dv.get();
  b.workspace = ws.get();
  expect_decode_matches(p, b, dout, ws, ref, "fp16_claimed_320_tokens_table_96");
}

}  // namespace
}  // namespace kvarn
