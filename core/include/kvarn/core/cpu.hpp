// What the CPU running the program can execute, for the builds chosen at run time (the AVX2
// transpose, the FMA build of variance_normalize's passes, the AVX2 + FMA build of the attention
// metrics' products).
#ifndef KVARN_CORE_CPU_HPP_
#define KVARN_CORE_CPU_HPP_

namespace kvarn {

// True on an x86-64 CPU with AVX2 (and FMA), false elsewhere.
bool cpu_has_avx2();
bool cpu_has_avx2_fma();

}  // namespace kvarn

#endif  // KVARN_CORE_CPU_HPP_
