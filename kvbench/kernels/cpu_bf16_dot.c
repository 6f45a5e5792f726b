/* bfloat16 matrix products on AVX-512 BF16's vdpbf16ps, for bfloat16 runs on CPUs without AMX (built with
 * cpu_ops.c).
 *
 * A decode step multiplies every weight by a few rows, so it waits on reading the weight. On a Zen 4 core oneDNN's
 * bfloat16 kernel read the weight at 35-85% of the memory's rate at one row and ran at 0.4-0.9x this kernel's rate
 * at 16 rows. Here each instruction multiplies 16 pairs of adjacent bfloat16 values of a row by 16 pairs of a weight
 * column and adds both products to a float32 sum (the products are exact; the sums are float32), and the result is
 * rounded to bfloat16 once at the end (round to nearest even, as torch rounds), after the bias.
 *
 * The weight is packed as [n_pad / 32][k_pad / 2][32][2]: for each strip of 32 output columns, the k/2 pairs of
 * their values, read front to back (with a software prefetch a few pairs ahead) in chunks of DOT_KC pairs that stay
 * in L1 while every tile of rows uses them; a tile of MR rows by 32 columns accumulates in 2 x MR registers, its
 * float32 sums kept between chunks. An odd k's last pair holds a zero; the row's value is paired with zero. Rows go
 * in blocks whose activations stay in the core's L2 while the strips stream past, so a block reads the weight once
 * (a first version's blocks of 24 rows at k = 2048 read a 50-row decode step's weight from memory three times);
 * within a block, in tiles of near-equal height.
 *
 * Streamed (the "bf16-dot-stream" path): a tile's software prefetch reaches only 4 KiB ahead, so with several tiles
 * per block the whole chunk is fetched from memory while the first tile runs and nothing is fetched while the others
 * reuse it: the memory is busy in bursts. Streamed, every tile also brings its share of the next chunk into L2 (a
 * tile of T takes 1/T of it, spread over its pairs), so the weight flows from memory while every tile computes. On a
 * Zen 4 core, with SmolLM2-135M's layer weights read from memory, that took 8-32 rows 1.08-1.26x faster and left 50
 * and more level; 1-6 rows moved either way within the noise.
 *
 * Measured on a Zen 4 core against oneDNN's bfloat16 kernel: ahead at decode sizes, level from a few hundred rows
 * at k = 576 and 0.8-0.95x there at k = 2048; which path (streamed or not, or oneDNN) to use at which row count is
 * measured on the machine (kvbench.cpu.cpu_choices), not decided here.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#define DOT_MR 12                /* 24 accumulators + 2 weight vectors + a broadcast of the 32 zmm registers */
#define DOT_AHEAD 32             /* pairs of k prefetched ahead: 4 KiB of the strip */
#define DOT_KC 256               /* pairs of k per chunk: the strip's chunk (32 KiB) stays in L1 for every tile */
#define DOT_MAX_BLOCK 384        /* rows per block at most: their partial sums (48 KiB) sit on the stack */
#define DOT_X_BYTES (768 * 1024) /* a block's activations: in L2 (1-2 MiB) beside the strip being read */

static inline __m512 bias_or_zero(const uint16_t *bias, int64_t col, int64_t cols, int half) {
    if (bias == 0) return _mm512_setzero_ps();
    uint16_t values[16] = {0};
    const int64_t first = col + 16 * half, count = cols - 16 * half;
    if (count > 0) memcpy(values, bias + first, (size_t)(count < 16 ? count : 16) * 2);
    __m256i half_bits;
    memcpy(&half_bits, values, 32);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half_bits), 16));
}

/* one chunk [p0, p1) of k's pairs for a tile of MR rows by cols (<= 32) columns of strip w ([k_pad/2][32][2]):
 * the sums start from the bias (first chunk) or from partial (MR x 32 floats, an earlier chunk's); after the last
 * chunk (with an odd k's last value) they are rounded to bfloat16 into out, else kept in partial. */
#define DEFINE_DOT_TILE(MR)                                                                                        \
    static void dot_tile_##MR(const uint16_t *x, int64_t ld_x, const uint16_t *w, int64_t p0, int64_t p1,        \
                              int64_t k, float *partial, const uint16_t *bias, int64_t col, uint16_t *out,         \
                              int64_t ld_out, int64_t cols, const uint16_t *next, int64_t next_pairs) {            \
        __m512 acc[MR][2];                                                                                         \
        const int first = p0 == 0, last = 2 * p1 >= k;                                                            \
        if (first) {                                                                                               \
            const __m512 b0 = bias_or_zero(bias, col, cols, 0), b1 = bias_or_zero(bias, col, cols, 1);             \
            for (int r = 0; r < MR; r++) {                                                                         \
                acc[r][0] = b0;                                                                                    \
                acc[r][1] = b1;                                                                                    \
            }                                                                                                      \
        } else {                                                                                                   \
            for (int r = 0; r < MR; r++) {                                                                         \
                acc[r][0] = _mm512_loadu_ps(partial + r * 32);                                                     \
                acc[r][1] = _mm512_loadu_ps(partial + r * 32 + 16);                                                \
            }                                                                                                      \
        }                                                                                                          \
        const int64_t pairs = p1 < k / 2 ? p1 : k / 2;                                                             \
        /* streamed: next_pairs pairs from next into L2, spread evenly over this tile's pairs (16.16 fixed point) */  \
        const int64_t next_step = next_pairs && pairs > p0 ? (next_pairs << 16) / (pairs - p0) : 0;                \
        int64_t next_at = 0;                                                                                       \
        for (int64_t p = p0; p < pairs; p++) {                                                                     \
            if (next_step) {                                                                                       \
                const char *line = (const char *)(next + (next_at >> 16) * 64);                                    \
                _mm_prefetch(line, _MM_HINT_T1);                                                                   \
                _mm_prefetch(line + 64, _MM_HINT_T1);                                                              \
                next_at += next_step;                                                                              \
            }                                                                                                      \
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + p * 64);                                          \
            const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + p * 64 + 32);                                     \
            __builtin_prefetch(w + (p + DOT_AHEAD) * 64);                                                          \
            __builtin_prefetch(w + (p + DOT_AHEAD) * 64 + 32);                                                     \
            for (int r = 0; r < MR; r++) {                                                                         \
                int32_t pair;                                                                                      \
                memcpy(&pair, x + r * ld_x + 2 * p, 4);                                                            \
                const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);                                             \
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);                                                   \
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);                                                   \
            }                                                                                                      \
        }                                                                                                          \
        if (!last) {                                                                                               \
            for (int r = 0; r < MR; r++) {                                                                         \
                _mm512_storeu_ps(partial + r * 32, acc[r][0]);                                                     \
                _mm512_storeu_ps(partial + r * 32 + 16, acc[r][1]);                                                \
            }                                                                                                      \
            return;                                                                                                \
        }                                                                                                          \
        if (k & 1) { /* the last value, paired with the zero the packing put beside it */                        \
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + (k / 2) * 64);                                    \
            const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + (k / 2) * 64 + 32);                               \
            for (int r = 0; r < MR; r++) {                                                                         \
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int32_t)x[r * ld_x + k - 1]);                     \
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);                                                   \
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);                                                   \
            }                                                                                                      \
        }                                                                                                          \
        for (int r = 0; r < MR; r++) {                                                                             \
            uint16_t row[32];                                                                                      \
            const __m256bh low = _mm512_cvtneps_pbh(acc[r][0]), high = _mm512_cvtneps_pbh(acc[r][1]);              \
            memcpy(row, &low, 32);                                                                                 \
            memcpy(row + 16, &high, 32);                                                                           \
            memcpy(out + r * ld_out, row, (size_t)cols * 2);                                                       \
        }                                                                                                          \
    }

DEFINE_DOT_TILE(1)
DEFINE_DOT_TILE(2)
DEFINE_DOT_TILE(3)
DEFINE_DOT_TILE(4)
DEFINE_DOT_TILE(5)
DEFINE_DOT_TILE(6)
DEFINE_DOT_TILE(7)
DEFINE_DOT_TILE(8)
DEFINE_DOT_TILE(9)
DEFINE_DOT_TILE(10)
DEFINE_DOT_TILE(11)
DEFINE_DOT_TILE(12)

typedef void (*dot_tile_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, int64_t, float *,
                            const uint16_t *, int64_t, uint16_t *, int64_t, int64_t,
                            const uint16_t *, int64_t);
static const dot_tile_fn DOT_TILES[DOT_MR] = {dot_tile_1, dot_tile_2, dot_tile_3, dot_tile_4,  dot_tile_5,  dot_tile_6,
                                              dot_tile_7, dot_tile_8, dot_tile_9, dot_tile_10, dot_tile_11, dot_tile_12};
#endif

/* out [m, n] (row stride ld_out) = bf16(x [m, k] (row stride ld_x) . W^T + bias) for the strips
 * [strip_begin, strip_end) of W packed as [n_pad / 32][k_pad / 2][32][2] bfloat16; bias may be null; columns at or
 * past n are not written; stream: the tiles share the prefetch of the next chunk (above). Threads may share a
 * product by taking disjoint strip ranges. Returns 0, or -1 when this build has no vdpbf16ps (nothing is written). */
int kvbench_linear_bf16dot(const uint16_t *x, int64_t m, int64_t k, int64_t ld_x, const uint16_t *packed,
                           int64_t strip_begin, int64_t strip_end, int64_t n, const uint16_t *bias, uint16_t *out,
                           int64_t ld_out, int64_t stream) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    const int64_t pairs_padded = (k + 1) / 2, chunk = DOT_KC;
    int64_t block = DOT_X_BYTES / ((k > 0 ? k : 1) * 2) / DOT_MR * DOT_MR;
    block = block < DOT_MR ? DOT_MR : block > DOT_MAX_BLOCK ? DOT_MAX_BLOCK : block;
    float partial[DOT_MAX_BLOCK * 32] __attribute__((aligned(64)));
    for (int64_t m0 = 0; m0 < m; m0 += block) {
        const int64_t m1 = m0 + block < m ? m0 + block : m;
        const int64_t tiles = (m1 - m0 + DOT_MR - 1) / DOT_MR, share = stream ? (chunk + tiles - 1) / tiles : 0;
        for (int64_t strip = strip_begin; strip < strip_end; strip++) {
            const uint16_t *w = packed + strip * pairs_padded * 64;
            const int64_t col = strip * 32, cols = n - col < 32 ? n - col : 32;
            for (int64_t p0 = 0; p0 == 0 || 2 * p0 < k; p0 += chunk) {
                const int64_t p1 = p0 + chunk;
                for (int64_t t = 0; t < tiles; t++) {
                    const int64_t r0 = m0 + (m1 - m0) * t / tiles, r1 = m0 + (m1 - m0) * (t + 1) / tiles;
                    DOT_TILES[r1 - r0 - 1](x + r0 * ld_x, ld_x, w, p0, p1, k, partial + (r0 - m0) * 32, bias, col,
                                           out + r0 * ld_out + col, ld_out, cols, w + (p1 + t * share) * 64, share);
                }
            }
        }
    }
    return 0;
#else
    (void)x, (void)m, (void)k, (void)ld_x, (void)packed, (void)strip_begin, (void)strip_end, (void)n, (void)bias;
    (void)out, (void)ld_out, (void)stream;
    return -1;
#endif
}
