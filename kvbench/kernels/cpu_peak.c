/* This core's peak rates, for the roofline (kvbench/models/roofline.py): how many multiply-adds its vector units
 * finish per second, and how fast one thread reads memory (built with cpu_ops.c).
 *
 * Each probe does work no real kernel can beat on this core: independent accumulator chains enough to keep every
 * vector unit busy (more chains than units x latency on every x86 core measured), with no memory traffic, or a
 * read of a buffer larger than the caches with several independent sums. The caller times them (best of a few
 * runs) and turns the counts they return into rates. The vector width is the build's: 512 bits where it targets
 * AVX-512, 256 with AVX, 128 elsewhere (the compiler maps the generic vectors onto what the target has).
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define PEAK_BYTES 64
#define PEAK_CHAINS 12 /* of 32 zmm registers */
#elif defined(__AVX__)
#define PEAK_BYTES 32
#define PEAK_CHAINS 10 /* of 16 ymm registers: the two operands stay in registers too */
#else
#define PEAK_BYTES 16
#define PEAK_CHAINS 8
#endif
typedef float peak_vector __attribute__((vector_size(PEAK_BYTES)));
#define PEAK_LANES (PEAK_BYTES / 4)

/* The vector width the probes run at, in bits. */
int kvbench_peak_vector_bits(void) { return PEAK_BYTES * 8; }

/* iterations x PEAK_CHAINS vector multiply-adds (fused where the target has FMA: GCC contracts a * b + c by
 * default) on values that stay finite; their sum goes to sink so nothing is optimised away. Returns the
 * floating-point operations done (a multiply-add counts 2). */
int64_t kvbench_peak_fma(int64_t iterations, float *sink) {
    peak_vector acc[PEAK_CHAINS], scale, shift;
    for (int i = 0; i < PEAK_LANES; i++) {
        scale[i] = 0.999f;
        shift[i] = 0.001f;
    }
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = scale * (float)(c + 1);
    for (int64_t i = 0; i < iterations; i++) {
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = acc[c] * scale + shift;
    }
    float total = 0.0f;
    for (int c = 0; c < PEAK_CHAINS; c++)
        for (int i = 0; i < PEAK_LANES; i++) total += acc[c][i];
    *sink = total;
    return iterations * PEAK_CHAINS * PEAK_LANES * 2;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

/* iterations x 12 vdpbf16ps (each: 16 lanes x 2 bfloat16 products added to a float32 sum); returns the
 * floating-point operations done (a product and its addition count 2), or -1 when this build has no vdpbf16ps. */
int64_t kvbench_peak_dpbf16(int64_t iterations, float *sink) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    enum { CHAINS = 12 };
    __m512 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), b = (__m512bh)_mm512_set1_epi32(0x3a833a83);
    for (int64_t i = 0; i < iterations; i++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    }
    float total = 0.0f;
    for (int c = 0; c < CHAINS; c++) total += _mm512_reduce_add_ps(acc[c]);
    *sink = total;
    return iterations * CHAINS * 16 * 2 * 2;
#else
    (void)iterations, (void)sink;
    return -1;
#endif
}

/* Reads count floats (count a multiple of 8 x the lanes) with 8 independent vector sums; the total goes to sink.
 * Returns the bytes read. */
int64_t kvbench_read_sweep(const float *data, int64_t count, float *sink) {
    enum { SUMS = 8 };
    peak_vector sums[SUMS];
    memset(sums, 0, sizeof(sums));
    const int64_t step = SUMS * PEAK_LANES;
    for (int64_t i = 0; i + step <= count; i += step) {
        for (int s = 0; s < SUMS; s++) {
            peak_vector value;
            memcpy(&value, data + i + s * PEAK_LANES, PEAK_BYTES);
            sums[s] += value;
        }
    }
    float total = 0.0f;
    for (int s = 0; s < SUMS; s++)
        for (int i = 0; i < PEAK_LANES; i++) total += sums[s][i];
    *sink = total;
    return count / step * step * 4;
}
