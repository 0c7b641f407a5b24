// Sub-byte code packing, upstream KVarN convention (host and device):
//   PACK = 8 / bits values per byte (bits 1..8; 3 bits -> 2 per byte, 5..8 bits -> 1 per byte);
//   value at index c lives in byte c / PACK at bit shift (c % PACK) * bits (4-bit: low nibble =
//   even index).
#ifndef KVARN_CORE_PACK_HPP_
#define KVARN_CORE_PACK_HPP_

#include <cstddef>
#include <cstdint>

#include "kvarn/core/portable_math.hpp"

namespace kvarn {

KVARN_HD constexpr int pack_factor(int bits) { return 8 / bits; }

KVARN_HD constexpr std::size_t packed_bytes(std::size_t n, int bits) {
  return (n + static_cast<std::size_t>(pack_factor(bits)) - 1) / static_cast<std::size_t>(pack_factor(bits));
}

// Packs n codes (each < 2^bits) into packed_bytes(n, bits) bytes; unused high bits are zero.
KVARN_HD void pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out) {
  const int pf = pack_factor(bits);
  const std::size_t nb = packed_bytes(n, bits);
  for (std::size_t b = 0; b < nb; ++b) out[b] = 0;
  for (std::size_t c = 0; c < n; ++c) {
    out[c / pf] = static_cast<std::uint8_t>(out[c / pf] | (codes[c] << ((c % pf) * bits)));
  }
}

KVARN_HD std::uint8_t unpack_code(const std::uint8_t* packed, std::size_t c, int bits) {
  const int pf = pack_factor(bits);
  const unsigned mask = (1u << bits) - 1u;
  return static_cast<std::uint8_t>((packed[c / pf] >> ((c % pf) * bits)) & mask);
}

KVARN_HD void unpack_codes(const std::uint8_t* packed, std::size_t n, int bits,
                           std::uint8_t* codes) {
  for (std::size_t c = 0; c < n; ++c) codes[c] = unpack_code(packed, c, bits);
}

}  // namespace kvarn

#endif  // KVARN_CORE_PACK_HPP_
