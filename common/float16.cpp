#include "common/float16.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace linnet {

/// IEEE 754 binary16 -> binary32, exact (every half is representable as a float).
/// Handles signed zeros, subnormals, infinities and NaNs (payload kept).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal half: normalise it; every half subnormal is a normal float.
      int shift = 0;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        ++shift;
      }
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 + 1 - shift) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

/// bfloat16 -> binary32, exact (the bf16 bits are the float's upper half).
float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40u);  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(b >> 16);
}

uint16_t float_to_half(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), rounded to nearest even
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // in units of 2^-24, exact
    const uint32_t q = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);  // round the 13 dropped bits, ties to even
  return static_cast<uint16_t>(sign | ((m - 0x38000000u) >> 13));
}

}  // namespace linnet
