/* float32 matrix products over weights kept as bfloat16, for weights that are exactly bfloat16 (built with
 * cpu_ops.c).
 *
 * Published checkpoints store bfloat16, so their weights loaded as float32 are bfloat16 numbers: a bfloat16 copy of
 * them is exact and half the bytes. A decode step multiplies every weight by a few rows only, so it waits on
 * memory: reading half the bytes is most of the gain. Each weight value is widened to float32 (exact: bfloat16 is
 * the top half of a float32) and multiplied with float32 fused multiply-adds, so the result is a float32 product
 * like any other float32 kernel's, with its own summation order (along k, in order).
 *
 * The weight is packed as [n_pad / 32][k][16][2]: for each strip of 32 output columns, the k rows of its 32 values,
 * each row as 16 pairs (column c, column c + 16), read once front to back per block of rows (the hardware prefetcher
 * follows it), in chunks of KC rows that stay in L1 while every tile of rows uses them; a tile of MR rows by 32
 * columns accumulates in registers: 2 x MR vectors of 16 floats. A row's 64 bytes widen to its two vectors with one
 * shift (the pairs' low halves: columns 0-15) and one mask (the high halves: columns 16-31), cheap beside the tile's
 * 2 x MR multiply-adds; widening each half with a zero-extension and a shift instead took a 16-row step's products
 * on a Zen 4 core about 11% longer (SmolLM2-135M's 30 layers from memory: 50.9 against 45.7 ms).
 *
 * Streamed (the "bf16-weights-stream" path), as in cpu_bf16_dot.c: with several tiles per block the first tile alone
 * fetched each chunk from memory and the memory idled while the others reused it; streamed, every tile also brings
 * its share of the next chunk into L2, spread over its rows of k. On a Zen 4 core, SmolLM2-135M's layer weights read
 * from memory, in two runs: 2-24 rows 1.1-1.44x faster, 32-64 rows 1.05-1.11x, one row 0.79-0.85x.
 *
 * Measured on a Zen 4 core (float32, bfloat16-valued weights, against oneDNN's packed float32 copy): 1.3-2.3x at one
 * row, where the product waits on memory; before the pair layout and the streamed path, 0.7-0.95x from 16 rows,
 * where oneDNN's tuned kernel wins on arithmetic. Which path to use at which row count is measured per machine
 * (kvbench.cpu.cpu_choices), not decided here.
 */
#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16d __attribute__((vector_size(64)));

#ifdef __AVX512F__
#define BF16W_MR 12 /* 24 accumulators + 2 weight vectors of the 32 zmm registers */
#else
#define BF16W_MR 3 /* with 16 ymm registers: 12 accumulators (a v16f is two of them) */
#endif

/* a packed row of 32 weights (16 pairs: column c low, column c + 16 high) as two vectors of 16 floats */
static inline void widen_row(const uint16_t *p, v16f *low, v16f *high) {
    v16d bits;
    memcpy(&bits, p, sizeof bits);
    const v16d columns_0_15 = bits << 16, columns_16_31 = bits & 0xffff0000u;
    memcpy(low, &columns_0_15, sizeof *low);
    memcpy(high, &columns_16_31, sizeof *high);
}

/* out[r][c] (+)= sum_p x[r][p] w[p][c] for r < MR, c < cols (<= 32), p < k, w the strip's rows [k][16][2]: the sums
 * start from zero when first is set, else from what out holds (an earlier chunk of k). */
#define DEFINE_TILE(MR)                                                                                            \
    static void tile_##MR(const float *x, int64_t ld_x, const uint16_t *w, int64_t k, float *out, int64_t ld_out, \
                          int64_t cols, int first, const uint16_t *next, int64_t next_lines) {                     \
        v16f acc[MR][2];                                                                                           \
        for (int r = 0; r < MR; r++) {                                                                             \
            if (first) {                                                                                           \
                acc[r][0] = acc[r][1] = (v16f){0};                                                                 \
            } else {                                                                                               \
                float row[32] = {0};                                                                               \
                memcpy(row, out + r * ld_out, (size_t)cols * 4);                                                   \
                memcpy(&acc[r][0], row, 64);                                                                       \
                memcpy(&acc[r][1], row + 16, 64);                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        /* streamed: next_lines rows of 32 weights (a cache line each) from next into L2, spread evenly over the   \
         * k rows here (16.16 fixed point; a short last chunk takes several per row) */                            \
        const int64_t next_step = k > 0 ? (next_lines << 16) / k : 0;                                              \
        int64_t next_at = 0, fetched = 0;                                                                          \
        for (int64_t p = 0; p < k; p++) {                                                                          \
            next_at += next_step;                                                                                  \
            for (; fetched < next_at >> 16; fetched++) __builtin_prefetch(next + fetched * 32, 0, 2);              \
            v16f w0, w1;                                                                                           \
            widen_row(w + p * 32, &w0, &w1);                                                                       \
            for (int r = 0; r < MR; r++) {                                                                         \
                const float value = x[r * ld_x + p];                                                               \
                acc[r][0] += value * w0;                                                                           \
                acc[r][1] += value * w1;                                                                           \
            }                                                                                                      \
        }                                                                                                          \
        for (int r = 0; r < MR; r++) {                                                                             \
            float row[32];                                                                                         \
            memcpy(row, &acc[r][0], 64);                                                                           \
            memcpy(row + 16, &acc[r][1], 64);                                                                      \
            memcpy(out + r * ld_out, row, (size_t)cols * 4);                                                       \
        }                                                                                                          \
    }

DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(3)
#if BF16W_MR > 3
DEFINE_TILE(4)
DEFINE_TILE(5)
DEFINE_TILE(6)
DEFINE_TILE(7)
DEFINE_TILE(8)
DEFINE_TILE(9)
DEFINE_TILE(10)
DEFINE_TILE(11)
DEFINE_TILE(12)
#endif

typedef void (*tile_fn)(const float *, int64_t, const uint16_t *, int64_t, float *, int64_t, int64_t, int,
                        const uint16_t *, int64_t);
static const tile_fn TILES[BF16W_MR] = {
    tile_1, tile_2, tile_3,
#if BF16W_MR > 3
    tile_4, tile_5, tile_6, tile_7, tile_8, tile_9, tile_10, tile_11, tile_12,
#endif
};

#define KC 256 /* k per chunk: a tile's activations (MR x KC floats) and the strip's chunk (KC x 64 B) stay in L1 */

/* out [m, n] (row stride ld_out) = x [m, k] (row stride ld_x) . W^T for the strips [strip_begin, strip_end) of W
 * packed as [n_pad / 32][k][16][2] bfloat16; columns at or past n are not written; stream: the tiles share the
 * prefetch of the next chunk (above). Threads may share a product by taking disjoint strip ranges. */
void kvbench_linear_bf16w_f32(const float *x, int64_t m, int64_t k, int64_t ld_x, const uint16_t *packed,
                              int64_t strip_begin, int64_t strip_end, int64_t n, float *out, int64_t ld_out,
                              int64_t stream) {
    /* a long step goes in blocks of rows whose activations stay in the core's L2 (about 256 KiB) while the strips
     * stream past them; a decode step is one block, so the weight is read from memory once. Within a block the
     * rows go in tiles of near-equal height (16 rows: two of 8, not 12 and 4), each using the strip's k chunk
     * while it is in L1. */
    int64_t block = 256 * 1024 / ((k < KC ? k : KC) * 4) / BF16W_MR * BF16W_MR;
    block = block < BF16W_MR ? BF16W_MR : block;
    for (int64_t m0 = 0; m0 < m; m0 += block) {
        const int64_t m1 = m0 + block < m ? m0 + block : m;
        const int64_t tiles = (m1 - m0 + BF16W_MR - 1) / BF16W_MR, share = stream ? (KC + tiles - 1) / tiles : 0;
        for (int64_t strip = strip_begin; strip < strip_end; strip++) {
            const uint16_t *w = packed + strip * k * 32;
            const int64_t col = strip * 32, cols = n - col < 32 ? n - col : 32;
            for (int64_t p0 = 0; p0 < k; p0 += KC) {
                const int64_t depth = k - p0 < KC ? k - p0 : KC;
                for (int64_t t = 0; t < tiles; t++) {
                    const int64_t r0 = m0 + (m1 - m0) * t / tiles, r1 = m0 + (m1 - m0) * (t + 1) / tiles;
                    TILES[r1 - r0 - 1](x + r0 * ld_x + p0, ld_x, w + p0 * 32, depth, out + r0 * ld_out + col, ld_out,
                                       cols, p0 == 0, w + (p0 + depth + t * share) * 32, share);
                }
            }
        }
    }
}
