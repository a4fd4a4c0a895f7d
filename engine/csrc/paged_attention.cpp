// Paged KV on CPU, for fp32 (f32) and bf16 (bf16). fg_paged_write_*: store a step's keys and
// values into their slots. fg_paged_decode_*: each query row (one new token of one sequence)
// attends to the first context_lens[r] positions stored in its KV pages, reading them in place.
//
// Layouts (one layer): q [R, H, D]; k_cache [NB, KH, D, BS], keys transposed inside a block so
// that one block's BS scores are a single vector accumulated over d; v_cache [NB, KH, BS, D];
// block_tables [R, max_blocks] int32; context_lens [R] int32; out [R, H, D]. Query head h reads
// KV head h / G with G = H / KH, as in HuggingFace's repeat_kv; the G heads of one KV head are
// computed together so each page is read once, and rows are spread over the OpenMP threads.
// BS must be 16, D 64 or 128, G at most 8.
// Softmax is exact two-pass (max, then exp and sum) in fp32; bf16 inputs are widened to fp32.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

using namespace fg;

constexpr int kBlock = kLanes;  // a KV block holds one vector of scores

struct Shape {
  int64_t heads, kv_heads, max_blocks, q_row_stride;
};

// Per-thread buffers of one row's attention, reused across rows.
struct Workspace {
  std::vector<float> q;  // [H][D] the row's queries, widened and scaled
  std::vector<float> scores;  // [H][span]: scores, then softmax numerators
  std::vector<float> inv_sum;  // [H]
  std::vector<v16> vmax;  // [H]
  std::vector<v16> acc;  // [H][D / kBlock]
};

// One row against its pages: block by block, all KV heads of a block in turn, so a block's keys
// (and later its values) are one contiguous read; the G query heads of a KV head share each load.
// Scores over all blocks first, then softmax, then the weighted values.
template <typename T, int D, int G>
void attend_row(const T* q, float scale, const T* k_cache, const T* v_cache, int64_t kv_heads,
                const int32_t* table, int64_t ctx, Workspace& ws, T* out) {
  constexpr int C = D / kBlock;
  const int64_t head_stride = int64_t{kBlock} * D, block_stride = kv_heads * head_stride;
  const int64_t nblk = (ctx + kBlock - 1) / kBlock, span = nblk * kBlock, H = kv_heads * G;
  std::vector<float>& scores = ws.scores;
  scores.resize(H * span);
  ws.inv_sum.resize(H);
  ws.vmax.resize(H);
  ws.acc.resize(H * C);
  v16* vmax = ws.vmax.data();
  v16* acc = ws.acc.data();
  float* inv_sum = ws.inv_sum.data();
  ws.q.resize(H * D);
  for (int64_t i = 0; i < H * D; ++i) ws.q[i] = to_float(q[i]) * scale;
  for (int64_t h = 0; h < H; ++h) vmax[h] = v16{} - INFINITY;
  for (int64_t i = 0; i < H * C; ++i) acc[i] = v16{};
  for (int64_t j = 0; j < nblk; ++j) {
    const T* kb = k_cache + table[j] * block_stride;
    for (int64_t kh = 0; kh < kv_heads; ++kh) {
      const T* kt = kb + kh * head_stride;
      const float* qh = ws.q.data() + kh * G * D;
      v16 even[G] = {}, odd[G] = {};
      for (int d = 0; d < D; d += 2) {
        const v16 k0 = load16(kt + d * kBlock), k1 = load16(kt + (d + 1) * kBlock);
        for (int g = 0; g < G; ++g) {
          even[g] += qh[g * D + d] * k0;
          odd[g] += qh[g * D + d + 1] * k1;
        }
      }
      for (int g = 0; g < G; ++g) {
        const int64_t h = kh * G + g;
        v16 s = even[g] + odd[g];
        for (int64_t t = ctx - j * kBlock; t < kBlock; ++t) s[t] = -INFINITY;
        vmax[h] = s > vmax[h] ? s : vmax[h];
        std::memcpy(scores.data() + h * span + j * kBlock, &s, sizeof s);
      }
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    float m = -INFINITY;
    for (int i = 0; i < kBlock; ++i) m = std::max(m, vmax[h][i]);
    v16 vsum{};
    float* sh = scores.data() + h * span;
    for (int64_t i = 0; i < span; i += kBlock) {
      const v16 p = vexp(load16(sh + i) - m);
      vsum += p;
      std::memcpy(sh + i, &p, sizeof p);
    }
    float sum = 0.f;
    for (int i = 0; i < kBlock; ++i) sum += vsum[i];
    inv_sum[h] = 1.f / sum;
  }
  constexpr int kTile = C < 4 ? C : 4;
  for (int64_t j = 0; j < nblk; ++j) {
    const T* vblock = v_cache + table[j] * block_stride;
    const int64_t n = std::min<int64_t>(kBlock, ctx - j * kBlock);
    for (int64_t kh = 0; kh < kv_heads; ++kh) {
      const T* vb = vblock + kh * head_stride;
      const float* p = scores.data() + kh * G * span + j * kBlock;
      v16* ah = acc + kh * G * C;
      for (int c0 = 0; c0 < C; c0 += kTile) {
        v16 a[G][kTile];
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < kTile; ++c) a[g][c] = ah[g * C + c0 + c];
        for (int64_t t = 0; t < n; ++t) {
          for (int c = 0; c < kTile; ++c) {
            const v16 v = load16(vb + t * D + (c0 + c) * kBlock);
            for (int g = 0; g < G; ++g) a[g][c] += p[g * span + t] * v;
          }
        }
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < kTile; ++c) ah[g * C + c0 + c] = a[g][c];
      }
    }
  }
  for (int64_t h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < kBlock; ++i)
        store(out + h * D + c * kBlock + i, acc[h * C + c][i] * inv_sum[h]);
}

template <typename T, int D, int G>
void decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
            const int32_t* context_lens, int64_t rows, Shape s, float scale, T* out,
            int num_threads) {
#pragma omp parallel num_threads(num_threads)
  {
    Workspace ws;
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; ++r) {
      attend_row<T, D, G>(q + r * s.q_row_stride, scale, k_cache, v_cache, s.kv_heads,
                          block_tables + r * s.max_blocks, context_lens[r], ws,
                          out + r * s.heads * D);
    }
  }
}

template <typename T, int D>
int dispatch_group(const T* q, const T* k, const T* v, const int32_t* tables,
                   const int32_t* lens, int64_t rows, Shape s, float scale, T* out, int threads) {
  switch (s.heads / s.kv_heads) {
    case 1: decode<T, D, 1>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 2: decode<T, D, 2>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 3: decode<T, D, 3>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 4: decode<T, D, 4>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 5: decode<T, D, 5>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 6: decode<T, D, 6>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 7: decode<T, D, 7>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    case 8: decode<T, D, 8>(q, k, v, tables, lens, rows, s, scale, out, threads); return 0;
    default: return 1;
  }
}

template <typename T>
int dispatch(const T* q, const T* k, const T* v, const int32_t* tables, const int32_t* lens,
             int64_t rows, Shape s, int64_t head_dim, float scale, T* out, int threads) {
  switch (head_dim) {
    case 64: return dispatch_group<T, 64>(q, k, v, tables, lens, rows, s, scale, out, threads);
    case 128: return dispatch_group<T, 128>(q, k, v, tables, lens, rows, s, scale, out, threads);
    default: return 1;
  }
}

template <typename T>
void write(const T* k, int64_t k_row_stride, const T* v, int64_t v_row_stride,
           const int64_t* blocks, const int64_t* offsets, int64_t tokens, int64_t kv_heads,
           int64_t head_dim, T* k_cache, T* v_cache) {
  const int64_t head_stride = kBlock * head_dim, block_stride = kv_heads * head_stride;
  for (int64_t t = 0; t < tokens; ++t) {
    T* kb = k_cache + blocks[t] * block_stride + offsets[t];
    T* vb = v_cache + blocks[t] * block_stride + offsets[t] * head_dim;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const T* krow = k + t * k_row_stride + h * head_dim;
      const T* vrow = v + t * v_row_stride + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) kb[h * head_stride + d * kBlock] = krow[d];
      std::memcpy(vb + h * head_stride, vrow, head_dim * sizeof(T));
    }
  }
}

}  // namespace

extern "C" {

// k, v: [tokens, kv_heads, head_dim] with unit strides inside a row; rows k_row_stride apart.
void fg_paged_write_f32(const float* k, int64_t k_row_stride, const float* v,
                        int64_t v_row_stride, const int64_t* blocks, const int64_t* offsets,
                        int64_t tokens, int64_t kv_heads, int64_t head_dim, float* k_cache,
                        float* v_cache) {
  write(k, k_row_stride, v, v_row_stride, blocks, offsets, tokens, kv_heads, head_dim, k_cache,
        v_cache);
}

void fg_paged_write_bf16(const uint16_t* k, int64_t k_row_stride, const uint16_t* v,
                         int64_t v_row_stride, const int64_t* blocks, const int64_t* offsets,
                         int64_t tokens, int64_t kv_heads, int64_t head_dim, uint16_t* k_cache,
                         uint16_t* v_cache) {
  write(k, k_row_stride, v, v_row_stride, blocks, offsets, tokens, kv_heads, head_dim, k_cache,
        v_cache);
}

// Returns 0 on success, 1 when head_dim or heads / kv_heads is not one the kernel is built for.
// q rows are q_row_stride elements apart (the heads of a row contiguous); out is contiguous.
int fg_paged_decode_f32(const float* q, int64_t q_row_stride, const float* k_cache,
                        const float* v_cache, const int32_t* block_tables,
                        const int32_t* context_lens, int64_t rows, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, int64_t max_blocks, float scale, float* out,
                        int num_threads) {
  return dispatch(q, k_cache, v_cache, block_tables, context_lens, rows,
                  Shape{heads, kv_heads, max_blocks, q_row_stride}, head_dim, scale, out,
                  num_threads);
}

int fg_paged_decode_bf16(const uint16_t* q, int64_t q_row_stride, const uint16_t* k_cache,
                         const uint16_t* v_cache, const int32_t* block_tables,
                         const int32_t* context_lens, int64_t rows, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, int64_t max_blocks, float scale,
                         uint16_t* out, int num_threads) {
  return dispatch(q, k_cache, v_cache, block_tables, context_lens, rows,
                  Shape{heads, kv_heads, max_blocks, q_row_stride}, head_dim, scale, out,
                  num_threads);
}

}  // extern "C"
