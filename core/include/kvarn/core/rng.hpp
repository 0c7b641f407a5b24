// A portable seeded generator (splitmix64 + xoshiro256**, Box-Muller normals): the same seed
// gives the same stream on every platform and standard library (std::normal_distribution is
// implementation-defined, so it is not used for anything that must reproduce).
#ifndef KVARN_CORE_RNG_HPP_
#define KVARN_CORE_RNG_HPP_

#include <cmath>
#include <cstdint>

namespace kvarn {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    std::uint64_t z = seed;
    for (auto& s : s_) s = splitmix(z);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1), 53 random bits.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(u1));
    double a = 6.283185307179586476925 * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix(std::uint64_t& z) {
    z += 0x9e3779b97f4a7c15ULL;
    std::uint64_t r = z;
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ULL;
    r = (r ^ (r >> 27)) * 0x94d049bb133111ebULL;
    return r ^ (r >> 31);
  }
  std::uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kvarn

#endif  // KVARN_CORE_RNG_HPP_
