// Internal: hot loops get an AVX2 clone chosen at load time. Only element-wise IEEE operations and
// the fixed canonical reduction order run in them, and FMA contraction is off, so every clone
// returns bit-identical results.
#ifndef KVARN_CORE_SRC_SIMD_HPP_
#define KVARN_CORE_SRC_SIMD_HPP_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVARN_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVARN_SIMD_CLONES
#endif

#endif  // KVARN_CORE_SRC_SIMD_HPP_
