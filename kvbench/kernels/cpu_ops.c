/* float32 kernels for the model runner on a CPU, built at first use by kernels/cpu_native.py with the machine's
 * C compiler and called through ctypes. The torch ops they replace define the contract; the tests hold them to it.
 *
 * - paged decode attention, read straight from the block pool (no gathered copy of K and V);
 * - RMSNorm, optionally after adding a residual in place (one pass instead of six torch ops);
 * - SiLU(gate) * up over the fused gate/up projection;
 * - rotary embedding applied in place to the q and k heads of the fused q/k/v projection.
 * Each does in one pass over memory what takes the torch path several ops, each with its own temporary: on a
 * small model most of a step's non-matmul time was these passes and the ops' fixed costs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* exp(x) for x <= 0 (scores minus their maximum), vectorisable: 2^n * p(r) with r in [-ln2/2, ln2/2].
 * Relative error about 2e-7 over the range used here; below -87 it returns 0. */
static inline float exp_nonpositive(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * log2e + 0.5f);
    float r = x - n * ln2_hi - n * ln2_lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* Each of the rows (len scores each) replaced by its softmax, in place. */
static void softmax_rows(float *scores, int64_t rows, int64_t len) {
    for (int64_t g = 0; g < rows; g++) {
        float *s = scores + g * len;
        float top = s[0];
        for (int64_t t = 1; t < len; t++)
            top = s[t] > top ? s[t] : top;
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < len; t++) {
            s[t] = exp_nonpositive(s[t] - top);
            total += s[t];
        }
        const float inv = 1.0f / total;
#pragma omp simd
        for (int64_t t = 0; t < len; t++)
            s[t] *= inv;
    }
}

/* Rows are prefetched this many tokens ahead: the next block's rows lie anywhere in the pool, where the hardware
 * prefetcher, which follows streams, cannot guess them (measured: 1.3x on a pool out of cache). */
#define PF 16

/* The row of token u of a context (all KV heads) into the cache, ahead of its use. */
static inline void prefetch_row(const float *cache, const int32_t *table, int64_t u, int64_t block_size, int64_t row) {
    const float *p = cache + ((int64_t)table[u / block_size] * block_size + u % block_size) * row;
    for (int64_t f = 0; f < row; f += 16)
        __builtin_prefetch(p + f, 0, 3);
}

/* Decode attention for any head_dim and group size (see kvbench_paged_decode_f32). Each token's K row (all KV
 * heads) and then its V row is read once, in order within its block, and
 * prefetched PF tokens ahead (measured on the tiny shape, 30 contexts of ~570 tokens in 16-token blocks spread over
 * the pool: 1.2x, as fast as over consecutive blocks). */
static int paged_decode_generic(
    const float *q, int64_t q_stride_b, int64_t q_stride_h,   /* q[b][h][d], d contiguous */
    const float *k_cache, const float *v_cache,               /* [blocks][block_size][Hkv][D], contiguous */
    const int32_t *tables, int64_t table_stride,              /* tables[b][i]: block id of the i-th block */
    const int32_t *lens,                                      /* context length of each request */
    float *out,                                               /* [B][Hq][D], contiguous */
    int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size, float scale)
{
    const int64_t group = num_heads / num_kv_heads;
    const int64_t row = num_kv_heads * head_dim; /* floats per token slot */
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; b++)
        longest = lens[b] > longest ? lens[b] : longest;
    float *scores = malloc(sizeof(float) * (size_t)(num_heads * (longest > 0 ? longest : 1)));
    if (!scores)
        return -1;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = lens[b];
        const int32_t *table = tables + b * table_stride;
        const float *qb = q + b * q_stride_b;
        float *o = out + b * num_heads * head_dim;
        memset(o, 0, sizeof(float) * (size_t)(num_heads * head_dim));
        if (len <= 0)
            continue;
        for (int64_t t = 0; t < len; t++) {
            const float *k = k_cache + ((int64_t)table[t / block_size] * block_size + t % block_size) * row;
            if (t + PF < len)
                prefetch_row(k_cache, table, t + PF, block_size, row);
            for (int64_t h = 0; h < num_heads; h++) {
                const float *qh = qb + h * q_stride_h;
                const float *kh = k + (h / group) * head_dim;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; d++)
                    dot += qh[d] * kh[d];
                scores[h * len + t] = dot * scale;
            }
        }
        softmax_rows(scores, num_heads, len);
        for (int64_t t = 0; t < len; t++) {
            const float *v = v_cache + ((int64_t)table[t / block_size] * block_size + t % block_size) * row;
            if (t + PF < len)
                prefetch_row(v_cache, table, t + PF, block_size, row);
            for (int64_t h = 0; h < num_heads; h++) {
                const float p = scores[h * len + t];
                const float *vh = v + (h / group) * head_dim;
                float *a = o + h * head_dim;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; d++)
                    a[d] += p * vh[d];
            }
        }
    }
    free(scores);
    return 0;
}

/* The decode attention of one request when head_dim is NV * 16 and each KV head serves G query heads, both known
 * at compile time (so the accumulators live in registers): one pass over the context's K rows (each row, all KV
 * heads, read once and in order) for the scores, the softmax, then per KV head one pass over its V rows for the
 * weighted sums. Measured against the generic loops on a 135M-class shape (50 requests of 192 tokens): 1.5x. */
typedef float v16 __attribute__((vector_size(64)));
#ifdef __clang__
#define SWAP_HALVES(x, a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p) \
    __builtin_shufflevector(x, x, a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p)
#else
typedef int32_t v16i __attribute__((vector_size(64)));
#define SWAP_HALVES(x, a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p) \
    __builtin_shuffle(x, (v16i){a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p})
#endif

static inline float hsum16(v16 x) {
    x += SWAP_HALVES(x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    x += SWAP_HALVES(x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    x += SWAP_HALVES(x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    x += SWAP_HALVES(x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return x[0];
}

static inline v16 load16(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store16(float *p, v16 x) { memcpy(p, &x, sizeof x); }

#define DEFINE_REQUEST_DECODE(NV, G)                                                                                   \
    static void decode_##NV##_##G(const float *q, int64_t q_stride_h, const float *k_cache,                    \
                                   const float *v_cache, const int32_t *table, int64_t len, int64_t block_size,  \
                                   int64_t row, float *scores, float *out, float scale, int64_t num_kv_heads) { \
        for (int64_t t = 0; t < len; t++) {                                                                     \
            const float *k = k_cache + ((int64_t)table[t / block_size] * block_size + t % block_size) * row;    \
            if (t + PF < len) {                                                                                  \
                const int64_t u = t + PF;                                                                        \
                const float *next = k_cache + ((int64_t)table[u / block_size] * block_size + u % block_size) * row; \
                for (int64_t f = 0; f < row; f += 16)                                                            \
                    __builtin_prefetch(next + f, 0, 3);                                                          \
            }                                                                                                   \
            for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {                                                  \
                v16 kv[NV];                                                                                     \
                for (int j = 0; j < NV; j++)                                                                    \
                    kv[j] = load16(k + kvh * NV * 16 + 16 * j);                                                 \
                for (int g = 0; g < G; g++) {                                                                   \
                    const float *qg = q + (kvh * G + g) * q_stride_h;                                           \
                    v16 acc = load16(qg) * kv[0];                                                               \
                    for (int j = 1; j < NV; j++)                                                                \
                        acc += load16(qg + 16 * j) * kv[j];                                                     \
                    scores[(kvh * G + g) * len + t] = hsum16(acc) * scale;                                      \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        softmax_rows(scores, G * num_kv_heads, len);                                                            \
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {                                                      \
            const float *vh = v_cache + kvh * NV * 16;                                                          \
            const float *sh = scores + kvh * G * len;                                                           \
            v16 acc[G][NV];                                                                                     \
            for (int g = 0; g < G; g++)                                                                         \
                for (int j = 0; j < NV; j++)                                                                    \
                    acc[g][j] = (v16){0};                                                                       \
            for (int64_t t = 0; t < len; t++) {                                                                 \
                const float *v = vh + ((int64_t)table[t / block_size] * block_size + t % block_size) * row;     \
                if (t + PF < len) {                                                                              \
                    const int64_t u = t + PF;                                                                    \
                    const float *next = vh + ((int64_t)table[u / block_size] * block_size + u % block_size) * row; \
                    for (int j = 0; j < NV; j++)                                                                 \
                        __builtin_prefetch(next + 16 * j, 0, 3);                                                 \
                }                                                                                               \
                v16 vv[NV];                                                                                     \
                for (int j = 0; j < NV; j++)                                                                    \
                    vv[j] = load16(v + 16 * j);                                                                 \
                for (int g = 0; g < G; g++) {                                                                   \
                    const float p = sh[g * len + t];                                                            \
                    for (int j = 0; j < NV; j++)                                                                \
                        acc[g][j] += p * vv[j];                                                                 \
                }                                                                                               \
            }                                                                                                   \
            for (int g = 0; g < G; g++)                                                                         \
                for (int j = 0; j < NV; j++)                                                                    \
                    store16(out + (kvh * G + g) * NV * 16 + 16 * j, acc[g][j]);                                 \
        }                                                                                                       \
    }

#define DEFINE_GROUPS(NV) \
    DEFINE_REQUEST_DECODE(NV, 1) DEFINE_REQUEST_DECODE(NV, 2) DEFINE_REQUEST_DECODE(NV, 3) DEFINE_REQUEST_DECODE(NV, 4) \
    DEFINE_REQUEST_DECODE(NV, 5) DEFINE_REQUEST_DECODE(NV, 6) DEFINE_REQUEST_DECODE(NV, 7) DEFINE_REQUEST_DECODE(NV, 8)
DEFINE_GROUPS(4) /* head_dim 64 */
DEFINE_GROUPS(8) /* head_dim 128 */

typedef void (*request_decode_fn)(const float *, int64_t, const float *, const float *, const int32_t *, int64_t, int64_t,
                           int64_t, float *, float *, float, int64_t);
static const request_decode_fn DECODE_64[8] = {decode_4_1, decode_4_2, decode_4_3, decode_4_4,
                                         decode_4_5, decode_4_6, decode_4_7, decode_4_8};
static const request_decode_fn DECODE_128[8] = {decode_8_1, decode_8_2, decode_8_3, decode_8_4,
                                          decode_8_5, decode_8_6, decode_8_7, decode_8_8};

/* Paged decode attention, float32. Returns 0, or -1 when scratch memory could not be allocated (nothing is
 * written then). Head dims 64 and 128 with up to 8 query heads per KV head take the register-blocked path above;
 * any other shape the generic loops. */
int kvbench_paged_decode_f32(
    const float *q, int64_t q_stride_b, int64_t q_stride_h,   /* q[b][h][d], d contiguous */
    const float *k_cache, const float *v_cache,               /* [blocks][block_size][Hkv][D], contiguous */
    const int32_t *tables, int64_t table_stride,              /* tables[b][i]: block id of the i-th block */
    const int32_t *lens,                                      /* context length of each request */
    float *out,                                               /* [B][Hq][D], contiguous */
    int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size, float scale)
{
    const int64_t group = num_heads / num_kv_heads;
    const request_decode_fn *family = head_dim == 64 ? DECODE_64 : head_dim == 128 ? DECODE_128 : NULL;
    if (!family || group < 1 || group > 8)
        return paged_decode_generic(q, q_stride_b, q_stride_h, k_cache, v_cache, tables, table_stride, lens, out,
                                    batch, num_heads, num_kv_heads, head_dim, block_size, scale);
    const request_decode_fn decode = family[group - 1];
    const int64_t row = num_kv_heads * head_dim;
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; b++)
        longest = lens[b] > longest ? lens[b] : longest;
    float *scores = malloc(sizeof(float) * (size_t)(num_heads * (longest > 0 ? longest : 1)));
    if (!scores)
        return -1;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = lens[b];
        float *o = out + b * num_heads * head_dim;
        if (len <= 0) {
            memset(o, 0, sizeof(float) * (size_t)(num_heads * head_dim));
            continue;
        }
        decode(q + b * q_stride_b, q_stride_h, k_cache, v_cache, tables + b * table_stride, len, block_size, row,
                scores, o, scale, num_kv_heads);
    }
    free(scores);
    return 0;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for rows r of x [rows][width]. With residual != NULL, x is
 * first replaced by x + residual (in place), the residual stream of a decoder layer. */
void kvbench_rms_norm_f32(float *x, const float *residual, const float *weight, float *out, int64_t rows,
                          int64_t width, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * width;
        float *o = out + r * width;
        float squares = 0.0f;
        if (residual) {
            const float *res = residual + r * width;
#pragma omp simd reduction(+ : squares)
            for (int64_t i = 0; i < width; i++) {
                xr[i] += res[i];
                squares += xr[i] * xr[i];
            }
        } else {
#pragma omp simd reduction(+ : squares)
            for (int64_t i = 0; i < width; i++)
                squares += xr[i] * xr[i];
        }
        const float inv = 1.0f / sqrtf(squares / (float)width + eps);
#pragma omp simd
        for (int64_t i = 0; i < width; i++)
            o[i] = xr[i] * inv * weight[i];
    }
}

/* out[r][i] = silu(gate_up[r][i]) * gate_up[r][half + i], silu(g) = g / (1 + exp(-g)). */
void kvbench_silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t half)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * half;
        float *o = out + r * half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            const float x = g[i];
            /* exp(-|x|) never overflows; sigmoid(x) = 1 / (1 + e) for x > 0, e / (1 + e) otherwise */
            const float e = exp_nonpositive(-fabsf(x));
            const float numerator = x > 0.0f ? 1.0f : e;
            o[i] = x * (numerator / (1.0f + e));
        }
#pragma omp simd
        for (int64_t i = 0; i < half; i++)
            o[i] *= g[half + i];
    }
}

/* Rotate heads [0, rotated) of x [tokens][x_heads][head_dim] in place: x * cos + swap_halves(x) * signed_sin,
 * with cos and signed_sin [tokens][head_dim] (the runner's tables). */
void kvbench_rotary_f32(float *x, int64_t token_stride, const float *cos, const float *signed_sin, int64_t tokens,
                        int64_t rotated, int64_t head_dim)
{
    const int64_t half = head_dim / 2;
    float swapped[1024];
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * head_dim;
        const float *s = signed_sin + t * head_dim;
        for (int64_t h = 0; h < rotated; h++) {
            float *v = x + t * token_stride + h * head_dim;
            for (int64_t d = 0; d < half; d++) {
                swapped[d] = v[d + half];
                swapped[d + half] = v[d];
            }
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++)
                v[d] = v[d] * c[d] + swapped[d] * s[d];
        }
    }
}

/* Copy each token's K and V rows ([kv_heads * head_dim] floats, contiguous within the token) into its slot of the
 * pools ([slots][kv_heads * head_dim]); a slot of -1 is skipped. */
void kvbench_write_kv_f32(const float *key, const float *value, int64_t key_stride, int64_t value_stride,
                          float *k_cache, float *v_cache, const int64_t *slots, int64_t tokens, int64_t row)
{
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0)
            continue;
        memcpy(k_cache + slot * row, key + t * key_stride, sizeof(float) * (size_t)row);
        memcpy(v_cache + slot * row, value + t * value_stride, sizeof(float) * (size_t)row);
    }
}
