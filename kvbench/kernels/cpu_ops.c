/* Kernels for the model runner on a CPU, float32 and bfloat16, built at first use by kernels/cpu_native.py with the
 * machine's C compiler and called through ctypes. The torch ops they replace define the contract; the tests hold
 * them to it.
 *
 * - paged decode attention, read straight from the block pool (no gathered copy of K and V);
 * - RMSNorm, optionally after adding a residual in place (one pass instead of six torch ops);
 * - SiLU(gate) * up over the fused gate/up projection;
 * - rotary embedding applied in place to the q and k heads of the fused q/k/v projection;
 * - the K/V write of a step's new tokens into their slots.
 * Each does in one pass over memory what takes the torch path several ops, each with its own temporary: on a
 * small model most of a step's non-matmul time was these passes and the ops' fixed costs.
 *
 * bfloat16 tensors are read and written as bfloat16 and computed on in float32, each result rounded to bfloat16
 * once (to nearest, ties to even, as torch rounds). Where the compiler targets AVX-512 BF16, the decode attention's
 * q.k products run on vdpbf16ps (32 bfloat16 products per instruction, summed in float32); elsewhere K is widened
 * to float32 first. The instruction set is the build's (-march=native, or the variant kvbench was asked for):
 * kvbench_isa() says what went in.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define KV_DPBF16 1
#endif

/* What this build was compiled for: 1 AVX2, 2 AVX-512F, 4 AVX-512 BF16 (vdpbf16ps), 8 AMX bfloat16 tiles. */
int kvbench_isa(void) {
    int isa = 0;
#ifdef __AVX2__
    isa |= 1;
#endif
#ifdef __AVX512F__
    isa |= 2;
#endif
#ifdef KV_DPBF16
    isa |= 4;
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    isa |= 8;
#endif
    return isa;
}

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

/* bfloat16 is the top half of a float32. */
static inline float bf16_to_f32(uint16_t half) {
    uint32_t bits = (uint32_t)half << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

/* Nearest bfloat16, ties to even (torch's rounding); a NaN stays a (quiet) NaN. Branch-free, so loops vectorise. */
static inline uint16_t f32_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (uint32_t)0 - (uint32_t)((bits & 0x7FFFFFFFu) > 0x7F800000u);
    return (uint16_t)((rounded & ~nan) | (((bits >> 16) | 0x40u) & nan));
}

/* Each of the rows (len scores each) replaced by its softmax, in place. */
static void softmax_rows(float *scores, int64_t rows, int64_t len) {
    for (int64_t g = 0; g < rows; g++) {
        float *s = scores + g * len;
        float top = s[0];
#pragma omp simd reduction(max : top)
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

/* The softmax of s[0, visible) in place, and zeros in s[visible, padded): padded is a multiple of 16 at least
 * visible (>= 1), so every loop runs whole vectors and a causal row needs no separate clearing. */
static void softmax_masked(float *s, int64_t visible, int64_t padded) {
    float top = -INFINITY;
#pragma omp simd reduction(max : top)
    for (int64_t t = 0; t < padded; t++) {
        const float value = t < visible ? s[t] : -INFINITY;
        top = value > top ? value : top;
    }
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < padded; t++) {
        const float e = exp_nonpositive(s[t] - top);
        s[t] = t < visible ? e : 0.0f;
        total += s[t];
    }
    const float inv = 1.0f / total;
#pragma omp simd
    for (int64_t t = 0; t < padded; t++)
        s[t] *= inv;
}

#define SLOT(table, t, block_size) ((int64_t)(table)[(t) / (block_size)] * (block_size) + (t) % (block_size))

/* Rows are prefetched pf_ahead tokens ahead: the next block's rows lie anywhere in the pool, where the hardware
 * prefetcher, which follows streams, cannot guess them. How far ahead and into which cache pays depends on the CPU
 * (a Sapphire Rapids: 16 tokens into L1 was 1.3x over none on a pool out of cache; an EPYC Zen 4: 16 or 32 into L2
 * was 1.15-1.45x over 16 into L1), so the caller passes what was measured on this machine (kvbench.models.
 * decode_prefetch). The decode entry points set these for their thread; 0 tokens ahead prefetches nothing. */
static _Thread_local int64_t pf_ahead = 16, pf_level = 1;

/* Prefetch the K or V row of token t + pf_ahead (row_elems values of type T from base): level 1 into L1, 2 into
 * L2 (the instruction's locality hint must be a constant, hence two loops). */
#define PREFETCH_ROW(T, base, table, t, len, block_size, row, row_elems)                                   \
    do {                                                                                                   \
        if (pf_ahead > 0 && (t) + pf_ahead < (len)) {                                                      \
            const T *next_ = (base) + SLOT(table, (t) + pf_ahead, block_size) * (row);                     \
            if (pf_level == 1)                                                                             \
                for (int64_t f_ = 0; f_ < (row_elems); f_ += 64 / (int64_t)sizeof(T))                      \
                    __builtin_prefetch(next_ + f_, 0, 3);                                                  \
            else                                                                                           \
                for (int64_t f_ = 0; f_ < (row_elems); f_ += 64 / (int64_t)sizeof(T))                      \
                    __builtin_prefetch(next_ + f_, 0, 2);                                                  \
        }                                                                                                  \
    } while (0)

/* Decode attention of one request for any head_dim and group size, K and V of element type T read through TO_F32;
 * q [heads][d] and out [heads][d] are float32 (out fully written). Each token's K row and then its V row is read
 * once, in order within its block. */
#define DEFINE_GENERIC_REQUEST(NAME, T, TO_F32)                                                                    \
    static void NAME(const float *q, int64_t q_stride_h, const T *k_cache, const T *v_cache, const int32_t *table, \
                     int64_t len, int64_t block_size, int64_t row, float *scores, float *o, float scale,          \
                     int64_t num_heads, int64_t group, int64_t head_dim) {                                         \
        memset(o, 0, sizeof(float) * (size_t)(num_heads * head_dim));                                              \
        if (len <= 0)                                                                                              \
            return;                                                                                                \
        for (int64_t t = 0; t < len; t++) {                                                                        \
            const T *k = k_cache + SLOT(table, t, block_size) * row;                                               \
            PREFETCH_ROW(T, k_cache, table, t, len, block_size, row, row);                                         \
            for (int64_t h = 0; h < num_heads; h++) {                                                              \
                const float *qh = q + h * q_stride_h;                                                              \
                const T *kh = k + (h / group) * head_dim;                                                          \
                float dot = 0.0f;                                                                                  \
                _Pragma("omp simd reduction(+ : dot)") for (int64_t d = 0; d < head_dim; d++) dot +=               \
                    qh[d] * TO_F32(kh[d]);                                                                         \
                scores[h * len + t] = dot * scale;                                                                 \
            }                                                                                                      \
        }                                                                                                          \
        softmax_rows(scores, num_heads, len);                                                                      \
        for (int64_t t = 0; t < len; t++) {                                                                        \
            const T *v = v_cache + SLOT(table, t, block_size) * row;                                               \
            PREFETCH_ROW(T, v_cache, table, t, len, block_size, row, row);                                         \
            for (int64_t h = 0; h < num_heads; h++) {                                                              \
                const float p = scores[h * len + t];                                                               \
                const T *vh = v + (h / group) * head_dim;                                                          \
                float *a = o + h * head_dim;                                                                       \
                _Pragma("omp simd") for (int64_t d = 0; d < head_dim; d++) a[d] += p * TO_F32(vh[d]);              \
            }                                                                                                      \
        }                                                                                                          \
    }

static inline float f32_identity(float x) { return x; }
DEFINE_GENERIC_REQUEST(generic_request_f32, float, f32_identity)
DEFINE_GENERIC_REQUEST(generic_request_bf16, uint16_t, bf16_to_f32)

/* The decode attention of one request when head_dim is NV * 16 and each KV head serves G query heads, both known
 * at compile time (so the accumulators live in registers): one pass over the context's K rows (each row, all KV
 * heads, read once and in order) for the scores, the softmax, then per KV head one pass over its V rows for the
 * weighted sums. Measured against the generic loops on a 135M-class shape (50 requests of 192 tokens): 1.5x. */
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
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

/* 16 bfloat16 values widened to float32 (exact). */
static inline v16 load16_bf16(const uint16_t *p) {
    v16h half;
    memcpy(&half, p, sizeof half);
    const v16u bits = __builtin_convertvector(half, v16u) << 16;
    v16 x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static inline void store16(float *p, v16 x) { memcpy(p, &x, sizeof x); }


/* scores[h * len + t] = scale * q[h] . k_t[h / G] for q float32 and K of type T widened by LOAD. */
#define DEFINE_SCORES(NAME, T, LOAD, NV, G)                                                                        \
    static void NAME##_##NV##_##G(const float *q, int64_t q_stride_h, const T *k_cache, const int32_t *table,      \
                                  int64_t len, int64_t block_size, int64_t row, float *scores, float scale,       \
                                  int64_t num_kv_heads) {                                                          \
        for (int64_t t = 0; t < len; t++) {                                                                        \
            const T *k = k_cache + SLOT(table, t, block_size) * row;                                               \
            PREFETCH_ROW(T, k_cache, table, t, len, block_size, row, row);                                         \
            for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {                                                     \
                v16 kv[NV];                                                                                        \
                for (int j = 0; j < NV; j++)                                                                       \
                    kv[j] = LOAD(k + kvh * NV * 16 + 16 * j);                                                      \
                for (int g = 0; g < G; g++) {                                                                      \
                    const float *qg = q + (kvh * G + g) * q_stride_h;                                              \
                    v16 acc = load16(qg) * kv[0];                                                                  \
                    for (int j = 1; j < NV; j++)                                                                   \
                        acc += load16(qg + 16 * j) * kv[j];                                                        \
                    scores[(kvh * G + g) * len + t] = hsum16(acc) * scale;                                         \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

/* out[h] = sum_t p[h][t] v_t[h / G] (float32 out [heads][NV * 16]) for V of type T widened by LOAD. */
#define DEFINE_WEIGHTED_SUM(NAME, T, LOAD, NV, G)                                                                  \
    static void NAME##_##NV##_##G(const T *v_cache, const int32_t *table, int64_t len, int64_t block_size,        \
                                  int64_t row, const float *scores, float *out, int64_t num_kv_heads) {            \
        for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {                                                         \
            const T *vh = v_cache + kvh * NV * 16;                                                                 \
            const float *sh = scores + kvh * G * len;                                                              \
            v16 acc[G][NV];                                                                                        \
            for (int g = 0; g < G; g++)                                                                            \
                for (int j = 0; j < NV; j++)                                                                       \
                    acc[g][j] = (v16){0};                                                                          \
            for (int64_t t = 0; t < len; t++) {                                                                    \
                const T *v = vh + SLOT(table, t, block_size) * row;                                                \
                PREFETCH_ROW(T, vh, table, t, len, block_size, row, NV * 16);                                      \
                v16 vv[NV];                                                                                        \
                for (int j = 0; j < NV; j++)                                                                       \
                    vv[j] = LOAD(v + 16 * j);                                                                      \
                for (int g = 0; g < G; g++) {                                                                      \
                    const float p = sh[g * len + t];                                                               \
                    for (int j = 0; j < NV; j++)                                                                   \
                        acc[g][j] += p * vv[j];                                                                    \
                }                                                                                                  \
            }                                                                                                      \
            for (int g = 0; g < G; g++)                                                                            \
                for (int j = 0; j < NV; j++)                                                                       \
                    store16(out + (kvh * G + g) * NV * 16 + 16 * j, acc[g][j]);                                    \
        }                                                                                                          \
    }

#ifdef KV_DPBF16
/* scores for bfloat16 q and K on vdpbf16ps: each instruction multiplies 16 pairs of adjacent bfloat16 values
 * (exact products) and adds them into float32 sums. */
#define DEFINE_SCORES_DP(NV, G)                                                                                    \
    static void scores_dp_##NV##_##G(const uint16_t *q, int64_t q_stride_h, const uint16_t *k_cache,              \
                                     const int32_t *table, int64_t len, int64_t block_size, int64_t row,          \
                                     float *scores, float scale, int64_t num_kv_heads) {                          \
        for (int64_t t = 0; t < len; t++) {                                                                        \
            const uint16_t *k = k_cache + SLOT(table, t, block_size) * row;                                        \
            PREFETCH_ROW(uint16_t, k_cache, table, t, len, block_size, row, row);                                  \
            for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {                                                     \
                __m512bh kv[NV / 2];                                                                               \
                for (int j = 0; j < NV / 2; j++)                                                                   \
                    kv[j] = (__m512bh)_mm512_loadu_si512(k + kvh * NV * 16 + 32 * j);                              \
                for (int g = 0; g < G; g++) {                                                                      \
                    const uint16_t *qg = q + (kvh * G + g) * q_stride_h;                                           \
                    __m512 acc = _mm512_setzero_ps();                                                              \
                    for (int j = 0; j < NV / 2; j++)                                                               \
                        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qg + 32 * j), kv[j]);             \
                    scores[(kvh * G + g) * len + t] = _mm512_reduce_add_ps(acc) * scale;                           \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }
#endif

#define DEFINE_SHAPE(NV, G)                                                                                        \
    DEFINE_SCORES(scores_f32, float, load16, NV, G)                                                                \
    DEFINE_SCORES(scores_bf16, uint16_t, load16_bf16, NV, G)                                                       \
    DEFINE_WEIGHTED_SUM(vsum_f32, float, load16, NV, G)                                                            \
    DEFINE_WEIGHTED_SUM(vsum_bf16, uint16_t, load16_bf16, NV, G)
#define DEFINE_GROUPS(NV)                                                                                          \
    DEFINE_SHAPE(NV, 1) DEFINE_SHAPE(NV, 2) DEFINE_SHAPE(NV, 3) DEFINE_SHAPE(NV, 4) DEFINE_SHAPE(NV, 5)           \
    DEFINE_SHAPE(NV, 6) DEFINE_SHAPE(NV, 7) DEFINE_SHAPE(NV, 8)
DEFINE_GROUPS(4) /* head_dim 64 */
DEFINE_GROUPS(8) /* head_dim 128 */
#ifdef KV_DPBF16
#define DEFINE_DP_GROUPS(NV)                                                                                       \
    DEFINE_SCORES_DP(NV, 1) DEFINE_SCORES_DP(NV, 2) DEFINE_SCORES_DP(NV, 3) DEFINE_SCORES_DP(NV, 4)               \
    DEFINE_SCORES_DP(NV, 5) DEFINE_SCORES_DP(NV, 6) DEFINE_SCORES_DP(NV, 7) DEFINE_SCORES_DP(NV, 8)
DEFINE_DP_GROUPS(4)
DEFINE_DP_GROUPS(8)
#endif

typedef void (*scores_f32_fn)(const float *, int64_t, const float *, const int32_t *, int64_t, int64_t, int64_t,
                              float *, float, int64_t);
typedef void (*scores_bf16_fn)(const float *, int64_t, const uint16_t *, const int32_t *, int64_t, int64_t, int64_t,
                               float *, float, int64_t);
typedef void (*vsum_f32_fn)(const float *, const int32_t *, int64_t, int64_t, int64_t, const float *, float *,
                            int64_t);
typedef void (*vsum_bf16_fn)(const uint16_t *, const int32_t *, int64_t, int64_t, int64_t, const float *, float *,
                             int64_t);
#define TABLE(PREFIX, NV)                                                                                          \
    {PREFIX##_##NV##_1, PREFIX##_##NV##_2, PREFIX##_##NV##_3, PREFIX##_##NV##_4,                                   \
     PREFIX##_##NV##_5, PREFIX##_##NV##_6, PREFIX##_##NV##_7, PREFIX##_##NV##_8}
static const scores_f32_fn SCORES_F32[2][8] = {TABLE(scores_f32, 4), TABLE(scores_f32, 8)};
static const scores_bf16_fn SCORES_BF16[2][8] = {TABLE(scores_bf16, 4), TABLE(scores_bf16, 8)};
static const vsum_f32_fn VSUM_F32[2][8] = {TABLE(vsum_f32, 4), TABLE(vsum_f32, 8)};
static const vsum_bf16_fn VSUM_BF16[2][8] = {TABLE(vsum_bf16, 4), TABLE(vsum_bf16, 8)};
#ifdef KV_DPBF16
typedef void (*scores_dp_fn)(const uint16_t *, int64_t, const uint16_t *, const int32_t *, int64_t, int64_t,
                             int64_t, float *, float, int64_t);
static const scores_dp_fn SCORES_DP[2][8] = {TABLE(scores_dp, 4), TABLE(scores_dp, 8)};
#endif

/* Which register-blocked family serves this shape: 0 for head_dim 64, 1 for 128, -1 for the generic loops. */
static int family_of(int64_t head_dim, int64_t group) {
    if (group < 1 || group > 8)
        return -1;
    return head_dim == 64 ? 0 : head_dim == 128 ? 1 : -1;
}

static int64_t longest_of(const int32_t *lens, int64_t batch) {
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; b++)
        longest = lens[b] > longest ? lens[b] : longest;
    return longest > 0 ? longest : 1;
}

/* Paged decode attention, float32. Returns 0, or -1 when scratch memory could not be allocated (nothing is
 * written then). Head dims 64 and 128 with up to 8 query heads per KV head take the register-blocked path above;
 * any other shape the generic loops. */
int kvbench_paged_decode_f32(
    const float *q, int64_t q_stride_b, int64_t q_stride_h,   /* q[b][h][d], d contiguous */
    const float *k_cache, const float *v_cache,               /* [blocks][block_size][Hkv][D], contiguous */
    const int32_t *tables, int64_t table_stride,              /* tables[b][i]: block id of the i-th block */
    const int32_t *lens,                                      /* context length of each request */
    float *out,                                               /* [B][Hq][D], contiguous */
    int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size, float scale,
    int64_t prefetch_ahead, int64_t prefetch_level)          /* tokens ahead (0: none); 1 into L1, 2 into L2 */
{
    pf_ahead = prefetch_ahead, pf_level = prefetch_level;
    const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim;
    const int family = family_of(head_dim, group);
    float *scores = malloc(sizeof(float) * (size_t)(num_heads * longest_of(lens, batch)));
    if (!scores)
        return -1;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = lens[b];
        const int32_t *table = tables + b * table_stride;
        float *o = out + b * num_heads * head_dim;
        if (family < 0) {
            generic_request_f32(q + b * q_stride_b, q_stride_h, k_cache, v_cache, table, len, block_size, row, scores,
                                o, scale, num_heads, group, head_dim);
        } else if (len <= 0) {
            memset(o, 0, sizeof(float) * (size_t)(num_heads * head_dim));
        } else {
            SCORES_F32[family][group - 1](q + b * q_stride_b, q_stride_h, k_cache, table, len, block_size, row,
                                          scores, scale, num_kv_heads);
            softmax_rows(scores, num_heads, len);
            VSUM_F32[family][group - 1](v_cache, table, len, block_size, row, scores, o, num_kv_heads);
        }
    }
    free(scores);
    return 0;
}

/* Paged decode attention, bfloat16 q, K, V and output, float32 inside (the output rounded once). Same contract and
 * return value as kvbench_paged_decode_f32. */
int kvbench_paged_decode_bf16(
    const uint16_t *q, int64_t q_stride_b, int64_t q_stride_h,
    const uint16_t *k_cache, const uint16_t *v_cache,
    const int32_t *tables, int64_t table_stride,
    const int32_t *lens,
    uint16_t *out,
    int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size, float scale,
    int64_t prefetch_ahead, int64_t prefetch_level)
{
    pf_ahead = prefetch_ahead, pf_level = prefetch_level;
    const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim, width = num_heads * head_dim;
    const int family = family_of(head_dim, group);
    float *scores = malloc(sizeof(float) * (size_t)(num_heads * longest_of(lens, batch) + 2 * width));
    if (!scores)
        return -1;
    float *qf = scores + num_heads * longest_of(lens, batch); /* q widened, [heads][d] */
    float *of = qf + width;                                    /* the output before rounding */
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = lens[b];
        const int32_t *table = tables + b * table_stride;
        const uint16_t *qb = q + b * q_stride_b;
        int widened = 0;
#ifdef KV_DPBF16
        if (family >= 0 && len > 0) {
            SCORES_DP[family][group - 1](qb, q_stride_h, k_cache, table, len, block_size, row, scores, scale,
                                         num_kv_heads);
            widened = -1; /* scores done, q not needed in float32 */
        }
#endif
        if (widened == 0) {
            for (int64_t h = 0; h < num_heads; h++)
                for (int64_t d = 0; d < head_dim; d++)
                    qf[h * head_dim + d] = bf16_to_f32(qb[h * q_stride_h + d]);
        }
        if (family < 0) {
            generic_request_bf16(qf, head_dim, k_cache, v_cache, table, len, block_size, row, scores, of, scale,
                                 num_heads, group, head_dim);
        } else if (len <= 0) {
            memset(of, 0, sizeof(float) * (size_t)width);
        } else {
            if (widened == 0)
                SCORES_BF16[family][group - 1](qf, head_dim, k_cache, table, len, block_size, row, scores, scale,
                                               num_kv_heads);
            softmax_rows(scores, num_heads, len);
            VSUM_BF16[family][group - 1](v_cache, table, len, block_size, row, scores, of, num_kv_heads);
        }
        uint16_t *o = out + b * width;
#pragma omp simd
        for (int64_t i = 0; i < width; i++)
            o[i] = f32_to_bf16(of[i]);
    }
    free(scores);
    return 0;
}

/* Causal prefill attention over the pool: the new tokens of each request attend to its cached context and to
 * themselves, reading K and V in place through the block table. Per request and KV head, K is first laid out
 * transposed ([d][position], float32) and V gathered ([position][d], float32) in scratch, once for every query
 * head and new token that reads them: a block of PQ queries scores 16 positions per multiply-add with no
 * horizontal sums; each query's scores row then takes its softmax (zeros past the positions it sees), and the
 * block's weighted sums of the gathered V rows are taken together, each V row loaded once for all PQ queries
 * (before, one query at a time with a loop over a run-time head_dim: 1.5x slower over a 16 x 128-token prefill
 * at SmolLM2's shape, the softmax's max loop then scalar too).
 * head_dim must be a multiple of 16 (at most 256): the caller checks. */
#define PQ 8 /* queries scored together */

/* acc[i] = sum over positions j < seen of p_i[j] * (vectors v0 .. v0 + NVB of V row j), for the PQ score rows of a
 * block (width apart; zero past each query's visible positions). NVB (1 or 2, a constant at each call) vectors per
 * pass keep PQ * NVB sums in registers: each V row is loaded once per pass for all the block's queries. */
static inline __attribute__((always_inline)) void weighted_block(const float *scores, int64_t width, const float *vg,
                                                                 int64_t head_dim, int64_t seen, int64_t v0, int nvb,
                                                                 v16 acc[PQ][2]) {
    for (int i = 0; i < PQ; i++)
        for (int c = 0; c < nvb; c++)
            acc[i][c] = (v16){0};
    for (int64_t j = 0; j < seen; j++) {
        const float *vr = vg + j * head_dim + 16 * v0;
        v16 vv[2];
        for (int c = 0; c < nvb; c++)
            vv[c] = load16(vr + 16 * c);
        for (int i = 0; i < PQ; i++) {
            const float p = scores[i * width + j];
            for (int c = 0; c < nvb; c++)
                acc[i][c] += p * vv[c];
        }
    }
}
#define DEFINE_PREFILL(NAME, T, TO_F32, STORE_ROW)                                                           \
    int NAME(const T *q, int64_t q_stride_t, int64_t q_stride_h, const T *k_cache, const T *v_cache,              \
             const int32_t *tables, int64_t table_stride, const int32_t *query_start, const int32_t *lens, T *out, \
             int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,       \
             float scale) {                                                                                        \
        const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim, nv = head_dim / 16;        \
        int64_t longest = 16;                                                                                      \
        for (int64_t b = 0; b < batch; b++)                                                                        \
            longest = lens[b] > longest ? lens[b] : longest;                                                       \
        const int64_t width = (longest + 15) / 16 * 16;                                                            \
        float *kt = malloc(sizeof(float) * (size_t)(2 * head_dim * width + PQ * width + PQ * head_dim));           \
        if (!kt)                                                                                                   \
            return -1;                                                                                             \
        float *vg = kt + head_dim * width, *scores = vg + head_dim * width, *qf = scores + PQ * width;             \
        for (int64_t b = 0; b < batch; b++) {                                                                      \
            const int64_t first = query_start[b], q_len = query_start[b + 1] - first, len = lens[b];               \
            const int64_t start = len - q_len, padded = (len + 15) / 16 * 16;                                      \
            const int32_t *table = tables + b * table_stride;                                                      \
            if (q_len <= 0)                                                                                        \
                continue;                                                                                          \
            for (int64_t g = 0; g < num_kv_heads; g++) {                                                           \
                for (int64_t j = 0; j < padded; j++) { /* K transposed, V gathered; zeros past the context */     \
                    const int64_t slot = j < len ? SLOT(table, j, block_size) * row + g * head_dim : -1;           \
                    for (int64_t d = 0; d < head_dim; d++) {                                                       \
                        kt[d * padded + j] = slot >= 0 ? TO_F32(k_cache[slot + d]) : 0.0f;                         \
                        vg[j * head_dim + d] = slot >= 0 ? TO_F32(v_cache[slot + d]) : 0.0f;                       \
                    }                                                                                              \
                }                                                                                                  \
                for (int64_t h = g * group; h < (g + 1) * group; h++) {                                            \
                    for (int64_t i0 = 0; i0 < q_len; i0 += PQ) {                                                   \
                        const int64_t count = q_len - i0 < PQ ? q_len - i0 : PQ;                                   \
                        const int64_t seen = start + i0 + count; /* positions the block's last query sees */       \
                        for (int64_t i = 0; i < PQ; i++)                                                           \
                            for (int64_t d = 0; d < head_dim; d++)                                                 \
                                qf[i * head_dim + d] =                                                             \
                                    i < count ? TO_F32(q[(first + i0 + i) * q_stride_t + h * q_stride_h + d]) : 0; \
                        for (int64_t j = 0; j < seen; j += 16) {                                                   \
                            v16 acc[PQ];                                                                           \
                            for (int i = 0; i < PQ; i++)                                                           \
                                acc[i] = (v16){0};                                                                 \
                            for (int64_t d = 0; d < head_dim; d++) {                                               \
                                const v16 column = load16(kt + d * padded + j);                                    \
                                for (int i = 0; i < PQ; i++)                                                       \
                                    acc[i] += qf[i * head_dim + d] * column;                                       \
                            }                                                                                      \
                            for (int i = 0; i < PQ; i++)                                                           \
                                store16(scores + i * width + j, acc[i] * scale);                                   \
                        }                                                                                          \
                        const int64_t rseen = (seen + 15) / 16 * 16;                                               \
                        for (int64_t i = 0; i < PQ; i++) { /* rows past the block's queries weigh nothing */       \
                            if (i < count)                                                                         \
                                softmax_masked(scores + i * width, start + i0 + i + 1, rseen);                     \
                            else                                                                                   \
                                memset(scores + i * width, 0, sizeof(float) * (size_t)rseen);                      \
                        }                                                                                          \
                        for (int64_t v0 = 0; v0 < nv; v0 += 2) {                                                   \
                            v16 acc[PQ][2];                                                                        \
                            const int nvb = nv - v0 >= 2 ? 2 : 1;                                                  \
                            if (nvb == 2)                                                                          \
                                weighted_block(scores, width, vg, head_dim, seen, v0, 2, acc);                     \
                            else                                                                                   \
                                weighted_block(scores, width, vg, head_dim, seen, v0, 1, acc);                     \
                            for (int64_t i = 0; i < count; i++)                                                    \
                                STORE_ROW(out + ((first + i0 + i) * num_heads + h) * head_dim + 16 * v0, acc[i], nvb);\
                        }                                                                                          \
                    }                                                                                              \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        free(kt);                                                                                                  \
        return 0;                                                                                                  \
    }

static inline void store_row_f32(float *o, const v16 *acc, int64_t nv) {
    for (int64_t v = 0; v < nv; v++)
        store16(o + 16 * v, acc[v]);
}

static inline void store_row_bf16(uint16_t *o, const v16 *acc, int64_t nv) {
    for (int64_t v = 0; v < nv; v++)
        for (int e = 0; e < 16; e++)
            o[16 * v + e] = f32_to_bf16(acc[v][e]);
}

/* Causal prefill attention, float32 (see above). Returns 0, or -1 when scratch memory could not be allocated. */
DEFINE_PREFILL(kvbench_paged_prefill_f32, float, f32_identity, store_row_f32)
/* The same for bfloat16 q, K, V and output, float32 inside, the output rounded once. */
DEFINE_PREFILL(kvbench_paged_prefill_bf16, uint16_t, bf16_to_f32, store_row_bf16)

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

/* kvbench_rms_norm_f32 for bfloat16 x, residual, weight and out: the sum x + residual is rounded to bfloat16 as
 * torch's add is (it is the residual stream kept in x), the norm is computed in float32 and rounded once. */
void kvbench_rms_norm_bf16(uint16_t *x, const uint16_t *residual, const uint16_t *weight, uint16_t *out,
                           int64_t rows, int64_t width, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *xr = x + r * width;
        uint16_t *o = out + r * width;
        float squares = 0.0f;
        if (residual) {
            const uint16_t *res = residual + r * width;
#pragma omp simd reduction(+ : squares)
            for (int64_t i = 0; i < width; i++) {
                const uint16_t sum = f32_to_bf16(bf16_to_f32(xr[i]) + bf16_to_f32(res[i]));
                const float value = bf16_to_f32(sum);
                xr[i] = sum;
                squares += value * value;
            }
        } else {
#pragma omp simd reduction(+ : squares)
            for (int64_t i = 0; i < width; i++) {
                const float value = bf16_to_f32(xr[i]);
                squares += value * value;
            }
        }
        const float inv = 1.0f / sqrtf(squares / (float)width + eps);
#pragma omp simd
        for (int64_t i = 0; i < width; i++)
            o[i] = f32_to_bf16(bf16_to_f32(xr[i]) * inv * bf16_to_f32(weight[i]));
    }
}

static inline float silu(float x) {
    /* exp(-|x|) never overflows; sigmoid(x) = 1 / (1 + e) for x > 0, e / (1 + e) otherwise */
    const float e = exp_nonpositive(-fabsf(x));
    const float numerator = x > 0.0f ? 1.0f : e;
    return x * (numerator / (1.0f + e));
}

/* out[r][i] = silu(gate_up[r][i]) * gate_up[r][half + i], silu(g) = g / (1 + exp(-g)). */
void kvbench_silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t half)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * half;
        float *o = out + r * half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++)
            o[i] = silu(g[i]);
#pragma omp simd
        for (int64_t i = 0; i < half; i++)
            o[i] *= g[half + i];
    }
}

/* The same for bfloat16, in float32 and rounded once. */
void kvbench_silu_and_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t half)
{
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *restrict g = gate_up + r * 2 * half;
        const uint16_t *restrict up = g + half;
        uint16_t *restrict o = out + r * half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++)
            o[i] = f32_to_bf16(silu(bf16_to_f32(g[i])) * bf16_to_f32(up[i]));
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

/* The same for bfloat16 x and tables, in float32 and rounded once. */
void kvbench_rotary_bf16(uint16_t *x, int64_t token_stride, const uint16_t *cos, const uint16_t *signed_sin,
                         int64_t tokens, int64_t rotated, int64_t head_dim)
{
    const int64_t half = head_dim / 2;
    float c[1024], s[1024], v[1024];
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t d = 0; d < head_dim; d++) {
            c[d] = bf16_to_f32(cos[t * head_dim + d]);
            s[d] = bf16_to_f32(signed_sin[t * head_dim + d]);
        }
        for (int64_t h = 0; h < rotated; h++) {
            uint16_t *xh = x + t * token_stride + h * head_dim;
            for (int64_t d = 0; d < head_dim; d++)
                v[d] = bf16_to_f32(xh[d]);
#pragma omp simd
            for (int64_t d = 0; d < half; d++) {
                xh[d] = f32_to_bf16(v[d] * c[d] + v[d + half] * s[d]);
                xh[d + half] = f32_to_bf16(v[d + half] * c[d + half] + v[d] * s[d + half]);
            }
        }
    }
}

/* Copy each token's K and V rows (row_bytes, contiguous within the token) into its slot of the pools ([slots] rows
 * of row_bytes); a slot of -1 is skipped. Strides are in bytes; any element type. */
void kvbench_write_kv(const char *key, const char *value, int64_t key_stride, int64_t value_stride, char *k_cache,
                      char *v_cache, const int64_t *slots, int64_t tokens, int64_t row_bytes)
{
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0)
            continue;
        memcpy(k_cache + slot * row_bytes, key + t * key_stride, (size_t)row_bytes);
        memcpy(v_cache + slot * row_bytes, value + t * value_stride, (size_t)row_bytes);
    }
}
