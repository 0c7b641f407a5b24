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
  return (n + static_cast<std::size_t>(pack_factor(bits)) - 1) /
         static_cast<std::size_t>(pack_factor(bits));
}

namespace detail {
template <int BITS>
KVARN_HD void pack_codes_fixed(const std::uint8_t* codes, std::size_t n, std::uint8_t* out) {
  constexpr int kPf = 8 / BITS;
  const std::size_t full = n / kPf;
  for (std::size_t b = 0; b < full; ++b) {
    unsigned v = 0;
    for (int j = 0; j < kPf; ++j) v |= static_cast<unsigned>(codes[b * kPf + j]) << (j * BITS);
    out[b] = static_cast<std::uint8_t>(v);
  }
  if (full * kPf < n) {
    unsigned v = 0;
    for (std::size_t c = full * kPf; c < n; ++c)
      v |= static_cast<unsigned>(codes[c]) << ((c % kPf) * BITS);
    out[full] = static_cast<std::uint8_t>(v);
  }
}
}  // namespace detail

// Packs n codes (each < 2^bits) into packed_bytes(n, bits) bytes; unused high bits are zero.
// Compile-time packing factors: the generic loop divides per element.
KVARN_HD void pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out) {
  switch (bits) {
    case 1:
      detail::pack_codes_fixed<1>(codes, n, out);
      return;
    case 2:
      detail::pack_codes_fixed<2>(codes, n, out);
      return;
    case 3:
      detail::pack_codes_fixed<3>(codes, n, out);
      return;
    case 4:
      detail::pack_codes_fixed<4>(codes, n, out);
      return;
    case 5:
      detail::pack_codes_fixed<5>(codes, n, out);
      return;
    case 6:
      detail::pack_codes_fixed<6>(codes, n, out);
      return;
    case 7:
      detail::pack_codes_fixed<7>(codes, n, out);
      return;
    default:
      detail::pack_codes_fixed<8>(codes, n, out);
      return;
  }
}

KVARN_HD std::uint8_t unpack_code(const std::uint8_t* packed, std::size_t c, int bits) {
  const int pf = pack_factor(bits);
  const unsigned mask = (1u << bits) - 1u;
  return static_cast<std::uint8_t>((packed[c / pf] >> ((c % pf) * bits)) & mask);
}

namespace detail {
// Byte by byte, the kPf codes of a byte unrolled: vectorizes (per-code indexing did not).
template <int BITS>
KVARN_HD void unpack_codes_fixed(const std::uint8_t* packed, std::size_t n, std::uint8_t* codes) {
  constexpr int kPf = 8 / BITS;
  constexpr unsigned kMask = (1u << BITS) - 1u;
  const std::size_t full = n / kPf;
  for (std::size_t b = 0; b < full; ++b) {
    const unsigned v = packed[b];
    for (int j = 0; j < kPf; ++j)
      codes[b * kPf + j] = static_cast<std::uint8_t>((v >> (j * BITS)) & kMask);
  }
  for (std::size_t c = full * kPf; c < n; ++c)
    codes[c] = static_cast<std::uint8_t>((packed[full] >> ((c % kPf) * BITS)) & kMask);
}
}  // namespace detail

// Inverse of pack_codes: n codes out of packed_bytes(n, bits) bytes (compile-time packing
// factors, as pack_codes).
KVARN_HD void unpack_codes(const std::uint8_t* packed, std::size_t n, int bits,
                           std::uint8_t* codes) {
  switch (bits) {
    case 1:
      detail::unpack_codes_fixed<1>(packed, n, codes);
      return;
    case 2:
      detail::unpack_codes_fixed<2>(packed, n, codes);
      return;
    case 3:
      detail::unpack_codes_fixed<3>(packed, n, codes);
      return;
    case 4:
      detail::unpack_codes_fixed<4>(packed, n, codes);
      return;
    case 5:
      detail::unpack_codes_fixed<5>(packed, n, codes);
      return;
    case 6:
      detail::unpack_codes_fixed<6>(packed, n, codes);
      return;
    case 7:
      detail::unpack_codes_fixed<7>(packed, n, codes);
      return;
    default:
      for (std::size_t c = 0; c < n; ++c) codes[c] = unpack_code(packed, c, bits);
      return;
  }
}

}  // namespace kvarn

#endif  // KVARN_CORE_PACK_HPP_
