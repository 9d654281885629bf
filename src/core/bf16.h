// bf16 / f16 <-> f32 conversion helpers (raw 16-bit storage as uint16_t).
#pragma once
#include <cstdint>
#include <cstring>

namespace lilac {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half, round to nearest even: subnormals below 2^-14, ±inf from 65520 on (the halfway point above
// the largest half, 65504), NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536: inf
  if (a >= 0x38800000u) {  // a normal half: rebias the exponent (127 -> 15), round the mantissa to 10 bits
    uint32_t m = a - 0x38000000u;
    m += 0xfffu + ((m >> 13) & 1u);  // a carry into the exponent is the right result (up to inf at 65520)
    return static_cast<uint16_t>(sign | (m >> 13));
  }
  float af;
  std::memcpy(&af, &a, 4);
  // Subnormal (or zero): the count of 2^-24 units, rounded to nearest even by the 2^23 trick (< 1024 units;
  // 1024 is the smallest normal's encoding).
  const float units = (af * 16777216.f + 8388608.f) - 8388608.f;
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(units));
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) { man <<= 1; --exp; }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace lilac
