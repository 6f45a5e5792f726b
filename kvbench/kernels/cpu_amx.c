/* float32-accurate matrix products on Intel AMX for weights that are exactly bfloat16, built with cpu_ops.c.
 *
 * Real checkpoints ship in bfloat16, so their weights loaded as float32 are bfloat16 numbers: keeping them as
 * bfloat16 loses nothing and halves the bytes a decode step reads. The activations are not bfloat16; each is
 * split into three bfloat16 terms (hi + lo + lolo, 24 significant bits between them, as many as float32 has),
 * and the AMX tile unit multiplies all three by the weight, each product exact and every sum in float32. The
 * result is a float32 matrix product with another summation order, like any other float32 kernel's.
 *
 * Where the compiler does not target AMX (no -mamx-bf16 under -march=native), the entry points say so and the
 * caller keeps torch's float32 matmul.
 */
#include <stdint.h>
#include <string.h>

#define KV_TILE_ROWS 16
#define KV_TILE_K 32 /* bfloat16 values along k in one tile row */

static inline uint16_t bf16_nearest(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    bits += 0x7FFFu + ((bits >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

static inline float bf16_widen(uint16_t half) {
    uint32_t bits = (uint32_t)half << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

/* 1 when each of the n float32 values (as bits) is a bfloat16 number: its low 16 bits are zero. Stops at the
 * first that is not, so a float32 model is turned down at once. */
int kvbench_all_bf16(const uint32_t *bits, int64_t n) {
    const int64_t block = 4096;
    for (int64_t start = 0; start < n; start += block) {
        const int64_t end = start + block < n ? start + block : n;
        uint32_t low = 0;
        for (int64_t i = start; i < end; i++) low |= bits[i] & 0xFFFFu;
        if (low) return 0;
    }
    return 1;
}

/* x [m, k] (row stride ld_x) as three bfloat16 terms, out [3][m_pad][k_pad], zero where padded. */
void kvbench_split3_bf16(const float *x, int64_t m, int64_t k, int64_t ld_x, uint16_t *out, int64_t m_pad,
                         int64_t k_pad) {
    const int64_t plane = m_pad * k_pad;
    uint16_t *hi = out, *lo = out + plane, *lolo = out + 2 * plane;
    for (int64_t i = 0; i < m; i++) {
        const float *row = x + i * ld_x;
        uint16_t *h = hi + i * k_pad, *l = lo + i * k_pad, *ll = lolo + i * k_pad;
        for (int64_t j = 0; j < k; j++) {
            float v = row[j];
            uint16_t a = bf16_nearest(v);
            float r = v - bf16_widen(a); /* exact: a is v's nearest bfloat16 */
            uint16_t b = bf16_nearest(r);
            h[j] = a;
            l[j] = b;
            ll[j] = bf16_nearest(r - bf16_widen(b));
        }
        for (int64_t j = k; j < k_pad; j++) h[j] = l[j] = ll[j] = 0;
    }
    for (int64_t i = m; i < m_pad; i++) {
        memset(hi + i * k_pad, 0, (size_t)k_pad * 2);
        memset(lo + i * k_pad, 0, (size_t)k_pad * 2);
        memset(lolo + i * k_pad, 0, (size_t)k_pad * 2);
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KV_ARCH_REQ_XCOMP_PERM 0x1023
#define KV_XFEATURE_XTILEDATA 18
#ifndef KV_PREFETCH_BLOCKS
#define KV_PREFETCH_BLOCKS 8 /* k blocks (2 KiB of weight each) requested ahead of use */
#endif

struct kv_tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* 1 when this process may use the AMX tiles (Linux grants them on request), 0 otherwise. */
int kvbench_amx_init(void) {
    return syscall(SYS_arch_prctl, KV_ARCH_REQ_XCOMP_PERM, KV_XFEATURE_XTILEDATA) == 0;
}

/* Tiles 0-3 accumulate a 32 x 32 block of the output, 4-5 hold two 16-row slices of the activations, 6-7 two
 * 16-column slices of the weight: every weight tile loaded is used by 2 row slices x 3 terms. */
static void configure_tiles(void) {
    struct kv_tile_config config;
    memset(&config, 0, sizeof config);
    config.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = KV_TILE_ROWS;
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}

/* How many of a tile's 16 rows (or columns) from start lie below limit. */
static inline int64_t span(int64_t start, int64_t limit) {
    return limit - start >= 16 ? 16 : (limit > start ? limit - start : 0);
}

static void store_tile_part(const float *tile, float *out, int64_t ld_out, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++) memcpy(out + i * ld_out, tile + i * 16, (size_t)cols * 4);
}

#define KV_STORE(t, row0, col0)                                                                    \
    do {                                                                                           \
        if ((row0) + 16 <= m && (col0) + 16 <= n) {                                                \
            _tile_stored(t, out + (row0) * ld_out + (col0), ld_out * 4);                           \
        } else if ((row0) < m && (col0) < n) {                                                     \
            _tile_stored(t, part, 64);                                                             \
            store_tile_part(part, out + (row0) * ld_out + (col0), ld_out, span(row0, m), span(col0, n)); \
        }                                                                                          \
    } while (0)

static void load_tile_part(float *tile, const float *out, int64_t ld_out, int64_t rows, int64_t cols) {
    memset(tile, 0, 16 * 16 * 4);
    for (int64_t i = 0; i < rows; i++) memcpy(tile + i * 16, out + i * ld_out, (size_t)cols * 4);
}

/* The accumulator tile t for the output block at (row0, col0): zero on the first k chunk, else what the earlier
 * chunks stored there. */
#define KV_START(t, row0, col0)                                                                    \
    do {                                                                                           \
        if (first_chunk) {                                                                         \
            _tile_zero(t);                                                                         \
        } else if ((row0) + 16 <= m && (col0) + 16 <= n) {                                         \
            _tile_loadd(t, out + (row0) * ld_out + (col0), ld_out * 4);                            \
        } else {                                                                                   \
            load_tile_part(part, out + (row0) * ld_out + (col0), ld_out, span(row0, m), span(col0, n));  \
            _tile_loadd(t, part, 64);                                                              \
        }                                                                                          \
    } while (0)

/* out [m, n] (row stride ld_out) = x . W^T for x given as split3 terms [3][m_pad][k_pad] (m_pad a multiple of
 * 32) and W packed by the caller as [n_pad / 32][k_pad / 32][2][16 k-pairs][16 columns][2]. The work goes in
 * blocks of m_chunk rows (a multiple of 32) by k_chunk (a multiple of 32) so that a block's activations stay in
 * the core's cache while the whole weight streams past them once. */
void kvbench_amx_linear_f32(const uint16_t *terms, int64_t m_pad, int64_t k_pad, const uint16_t *packed,
                            int64_t n_pad, float *out, int64_t m, int64_t n, int64_t ld_out, int64_t m_chunk,
                            int64_t k_chunk) {
    float part[16 * 16];
    const int64_t plane = m_pad * k_pad, row_bytes = k_pad * 2, k_blocks = k_pad / KV_TILE_K;
    const int64_t chunk_blocks = k_chunk / KV_TILE_K;
    configure_tiles();
    for (int64_t m0 = 0; m0 < m_pad; m0 += m_chunk) {
        const int64_t m1 = m0 + m_chunk < m_pad ? m0 + m_chunk : m_pad;
        for (int64_t kb0 = 0; kb0 < k_blocks; kb0 += chunk_blocks) {
            const int64_t kb1 = kb0 + chunk_blocks < k_blocks ? kb0 + chunk_blocks : k_blocks;
            const int first_chunk = kb0 == 0;
            for (int64_t strip = 0; strip < n_pad / 32; strip++) {
                const uint16_t *weights = packed + strip * k_blocks * 1024;
                const int64_t col = strip * 32;
                for (int64_t row = m0; row < m1; row += 32) {
                    KV_START(0, row, col);
                    KV_START(1, row, col + 16);
                    KV_START(2, row + 16, col);
                    KV_START(3, row + 16, col + 16);
                    for (int64_t kb = kb0; kb < kb1; kb++) {
                        if (row == m0) { /* the weight's first pass comes from memory: ask for it ahead */
                            const char *ahead = (const char *)(weights + (kb + KV_PREFETCH_BLOCKS) * 1024);
                            for (int line = 0; line < 2048; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
                        }
                        _tile_loadd(6, weights + kb * 1024, 64);
                        _tile_loadd(7, weights + kb * 1024 + 512, 64);
                        for (int term = 0; term < 3; term++) {
                            const uint16_t *a = terms + term * plane + row * k_pad + kb * KV_TILE_K;
                            _tile_loadd(4, a, row_bytes);
                            _tile_loadd(5, a + 16 * k_pad, row_bytes);
                            _tile_dpbf16ps(0, 4, 6);
                            _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6);
                            _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    KV_STORE(0, row, col);
                    KV_STORE(1, row, col + 16);
                    KV_STORE(2, row + 16, col);
                    KV_STORE(3, row + 16, col + 16);
                }
            }
        }
    }
    _tile_release();
}

#else

int kvbench_amx_init(void) { return 0; }

void kvbench_amx_linear_f32(const uint16_t *terms, int64_t m_pad, int64_t k_pad, const uint16_t *packed,
                            int64_t n_pad, float *out, int64_t m, int64_t n, int64_t ld_out, int64_t m_chunk,
                            int64_t k_chunk) {
    (void)terms, (void)m_pad, (void)k_pad, (void)packed, (void)n_pad, (void)out, (void)m, (void)n, (void)ld_out,
        (void)m_chunk, (void)k_chunk;
}

#endif
