// Shared helpers of the runner's CPU kernels: 16-lane float vectors (GCC vector extensions, so the
// compiler picks AVX-512 or AVX2 for the host CPU), bf16 <-> fp32 conversion and exp.
// bf16 values travel as their raw uint16 bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fg {

constexpr int kLanes = 16;
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

inline v16 load16(const float* p) { v16 v; std::memcpy(&v, p, sizeof v); return v; }

inline v16 load16(const uint16_t* p) {
  v16h h; std::memcpy(&h, p, sizeof h);
  v16u u = __builtin_convertvector(h, v16u) << 16;
  v16 v; std::memcpy(&v, &u, sizeof v); return v;
}

inline float to_float(float x) { return x; }

inline float to_float(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16; float f; std::memcpy(&f, &u, sizeof f); return f;
}

inline void store(float* p, float x) { *p = x; }

inline void store(uint16_t* p, float x) {  // round to nearest even, as torch does
  uint32_t u; std::memcpy(&u, &x, sizeof u);
  *p = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// exp(x) for x <= 0: Cody-Waite reduction and a degree-6 polynomial (Cephes expf), about 1 ulp.
inline v16 vexp(v16 x) {
  const v16 lo = v16{} - 87.f;
  x = x < lo ? lo : x;
  // round(x / ln 2) for x <= 0: truncation toward zero of (x / ln 2 - 0.5), all in vector registers
  const v16i ni = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, v16i);
  const v16 n = __builtin_convertvector(ni, v16);
  const v16 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const v16i e = (ni + 127) << 23;
  v16 scale; std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

// T(x) as torch rounds a float result into a tensor of T.
template <typename T>
inline T round_to(float x) {
  T out;
  store(&out, x);
  return out;
}

// exp(x) for any float x, scalar but vectorisable inside `omp simd` loops: the same reduction and
// polynomial as vexp, rounding x / ln 2 by the 1.5 * 2^23 trick; overflows to inf above 88.7.
inline float exp_any(float x) {
  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

}  // namespace fg
