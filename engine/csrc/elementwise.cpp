// Row-wise kernels of the model runner on CPU, for fp32 (f32) and bf16 (bf16):
// fg_argmax_*: index of the first maximum of each row (torch.argmax's answer).
// fg_add_rms_norm_*: x += delta (optional), then out = weight * T(x * rsqrt(mean(x^2) + eps)),
//   in fp32 and rounded to T where HF's Llama/Qwen2 RMSNorm rounds.
// fg_silu_mul_*: out = T(silu(gate)) * up for rows laid out [gate | up].
// fg_rope_*: rotate-half RoPE in place on the first `heads` heads of each row, with cos and a
//   sign-folded sin (so rotate_half(x) * sin == roll(x, D/2) * sin_folded) tabulated per position.
// Each operation is one pass over its rows, spread over threads only when there is enough work.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace {

using namespace fg;

constexpr int64_t kParallelWork = 1 << 16;  // elements below which a fork costs more than it saves

// First index of the row's maximum: per-lane running maxima (strictly greater, so each lane keeps
// its first maximum), then the smallest index among the lanes holding the overall maximum.
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  v16i lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  v16 best = v16{} - INFINITY;
  v16i best_at = v16i{} - 1;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const v16 v = load16(x + i);
    const v16i greater = v > best;
    best = greater ? v : best;
    best_at = greater ? lane + static_cast<int32_t>(i) : best_at;
  }
  float m = to_float(x[0]);  // index 0 unless something larger comes, as torch.argmax
  int64_t at = 0;
  for (int l = 0; l < kLanes; ++l) {
    if (best_at[l] >= 0 && (best[l] > m || (best[l] == m && best_at[l] < at))) {
      m = best[l];
      at = best_at[l];
    }
  }
  for (; i < n; ++i) {
    if (to_float(x[i]) > m) {
      m = to_float(x[i]);
      at = i;
    }
  }
  return at;
}

template <typename T>
void argmax(const T* x, int64_t rows, int64_t cols, int64_t* out, int num_threads) {  // cols >= 1
#pragma omp parallel for num_threads(num_threads) if (rows * cols >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) out[r] = argmax_row(x + r * cols, cols);
}

template <typename T>
void add_rms_norm(T* x, const T* delta, const T* weight, float eps, T* out, int64_t rows,
                  int64_t cols, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * cols >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * cols;
    T* o = out + r * cols;
    if (delta != nullptr) {
      const T* dr = delta + r * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) xr[c] = round_to<T>(to_float(xr[c]) + to_float(dr[c]));
    }
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t c = 0; c < cols; ++c) squares += to_float(xr[c]) * to_float(xr[c]);
    const float inv = 1.f / std::sqrt(squares / static_cast<float>(cols) + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c)
      o[c] = round_to<T>(to_float(weight[c]) * to_float(round_to<T>(to_float(xr[c]) * inv)));
  }
}

template <typename T>
void silu_mul(const T* gate_up, T* out, int64_t rows, int64_t inter, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * inter >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * inter;
    const T* u = g + inter;
    T* o = out + r * inter;
#pragma omp simd
    for (int64_t c = 0; c < inter; ++c) {
      const float gf = to_float(g[c]);
      const T silu = round_to<T>(gf / (1.f + exp_any(-gf)));
      o[c] = round_to<T>(to_float(silu) * to_float(u[c]));
    }
  }
}

template <typename T>
void rope(T* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
          const T* cos, const T* sin_folded, const int64_t* positions, int num_threads) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (rows * heads * head_dim >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* c = cos + positions[r] * head_dim;
    const T* s = sin_folded + positions[r] * head_dim;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + r * row_stride + h * head_dim;
      float rolled[512];  // head_dim <= 512, checked by the caller
#pragma omp simd
      for (int64_t d = 0; d < half; ++d) {
        rolled[d] = to_float(v[d + half]);
        rolled[d + half] = to_float(v[d]);
      }
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) {
        const T direct = round_to<T>(to_float(v[d]) * to_float(c[d]));
        const T turned = round_to<T>(rolled[d] * to_float(s[d]));
        v[d] = round_to<T>(to_float(direct) + to_float(turned));
      }
    }
  }
}

}  // namespace

extern "C" {

void fg_argmax_f32(const float* x, int64_t rows, int64_t cols, int64_t* out, int num_threads) {
  argmax(x, rows, cols, out, num_threads);
}

void fg_argmax_bf16(const uint16_t* x, int64_t rows, int64_t cols, int64_t* out,
                    int num_threads) {
  argmax(x, rows, cols, out, num_threads);
}

void fg_add_rms_norm_f32(float* x, const float* delta, const float* weight, float eps, float* out,
                         int64_t rows, int64_t cols, int num_threads) {
  add_rms_norm(x, delta, weight, eps, out, rows, cols, num_threads);
}

void fg_add_rms_norm_bf16(uint16_t* x, const uint16_t* delta, const uint16_t* weight, float eps,
                          uint16_t* out, int64_t rows, int64_t cols, int num_threads) {
  add_rms_norm(x, delta, weight, eps, out, rows, cols, num_threads);
}

void fg_silu_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t inter,
                     int num_threads) {
  silu_mul(gate_up, out, rows, inter, num_threads);
}

void fg_silu_mul_bf16(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter,
                      int num_threads) {
  silu_mul(gate_up, out, rows, inter, num_threads);
}

void fg_rope_f32(float* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
                 const float* cos, const float* sin_folded, const int64_t* positions,
                 int num_threads) {
  rope(x, rows, row_stride, heads, head_dim, cos, sin_folded, positions, num_threads);
}

void fg_rope_bf16(uint16_t* x, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
                  const uint16_t* cos, const uint16_t* sin_folded, const int64_t* positions,
                  int num_threads) {
  rope(x, rows, row_stride, heads, head_dim, cos, sin_folded, positions, num_threads);
}

}  // extern "C"
