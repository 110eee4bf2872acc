/* Inverted dropout's map, y = x scale where index i's draw keeps it, else x times 0: the
 * counter hash of (key, i) that every backend draws with (backend/dropout_bits.py; the CUDA
 * kernel dropout_apply in neuron.cu is the same function), so nothing is drawn into an
 * array and backward recomputes the mask from the key. */
#include <stdint.h>
#include <string.h>

#include "avx512.h"
#include "parts.h"
#include "vector_loop.h"

static inline uint32_t mix(uint32_t v)
{
    v ^= v >> 16;
    v *= 0x85ebca6bu;
    v ^= v >> 13;
    v *= 0xc2b2ae35u;
    v ^= v >> 16;
    return v;
}

/* 1.0f where index i's draw keeps it, else 0.0f: the bits of 1.0f under a mask of the test,
 * as a choice (between two floats, or two masks) is a branch a value to the compiler. */
static inline float kept(uint32_t i, uint32_t key0, uint32_t key1, uint32_t threshold)
{
    const uint32_t bits = mix(mix(i ^ key0) ^ key1);
    const uint32_t one = (uint32_t)-(int32_t)((bits >> 8) >= threshold) & 0x3f800000u;
    float f;
    memcpy(&f, &one, sizeof f);
    return f;
}

/* Indices [start, start + n) of x and y (int32, as the CUDA kernel's); y may be x (Caffe's
 * in-place Dropout), which has its loop: with restrict pointers that may alias, the compiler
 * guards the vector loop with an overlap test that an in-place call fails. */
VECTOR_LOOP
static void apply(const float *restrict x, float *restrict y, int32_t start, int32_t n,
                  uint32_t key0, uint32_t key1, uint32_t threshold, float scale)
{
    for (int32_t i = 0; i < n; ++i)
        y[i] = x[i] * kept((uint32_t)start + (uint32_t)i, key0, key1, threshold) * scale;
}

VECTOR_LOOP
static void apply_in_place(float *y, int32_t start, int32_t n, uint32_t key0, uint32_t key1,
                           uint32_t threshold, float scale)
{
    for (int32_t i = 0; i < n; ++i)
        y[i] = y[i] * kept((uint32_t)start + (uint32_t)i, key0, key1, threshold) * scale;
}

static void apply_any(const float *x, float *y, int32_t start, int32_t n, uint32_t key0,
                      uint32_t key1, uint32_t threshold, float scale)
{
    if (x == y)
        apply_in_place(y, start, n, key0, key1, threshold, scale);
    else
        apply(x, y, start, n, key0, key1, threshold, scale);
}

#if HAVE_AVX512
#define STEP 4          /* vectors hashed side by side */

/* The hash's chain of multiplies is long: the vectorised loop above keeps too few of them in
 * flight to fill the multiplier, and hashes at 0.64 ns a value; four vectors interleaved a
 * step take 0.42. The same values bit for bit: (x times 1 or 0) times scale. */
AVX512 static void apply_avx512(const float *x, float *y, int32_t start, int32_t n,
                                uint32_t key0, uint32_t key1, uint32_t threshold, float scale)
{
    const __m512i m1 = _mm512_set1_epi32((int)0x85ebca6bu), m2 = _mm512_set1_epi32(
        (int)0xc2b2ae35u);
    const __m512i k0 = _mm512_set1_epi32((int)key0), k1 = _mm512_set1_epi32((int)key1);
    const __m512i bar = _mm512_set1_epi32((int)threshold), sixteen = _mm512_set1_epi32(16);
    const __m512 s = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
    __m512i index = _mm512_add_epi32(_mm512_set1_epi32(start), _mm512_setr_epi32(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    int32_t i = 0;
    for (; i + 16 * STEP <= n; i += 16 * STEP) {
        __m512i v[STEP];
        for (int u = 0; u < STEP; ++u) {
            v[u] = _mm512_xor_si512(index, k0);
            index = _mm512_add_epi32(index, sixteen);
        }
        for (int round = 0; round < 2; ++round) {
            for (int u = 0; u < STEP; ++u)
                v[u] = _mm512_mullo_epi32(_mm512_xor_si512(v[u], _mm512_srli_epi32(v[u], 16)),
                                          m1);
            for (int u = 0; u < STEP; ++u)
                v[u] = _mm512_mullo_epi32(_mm512_xor_si512(v[u], _mm512_srli_epi32(v[u], 13)),
                                          m2);
            for (int u = 0; u < STEP; ++u)       /* the second round's input takes key1 */
                v[u] = _mm512_ternarylogic_epi32(v[u], _mm512_srli_epi32(v[u], 16),
                                                 round == 0 ? k1 : _mm512_setzero_si512(),
                                                 0x96);
        }
        for (int u = 0; u < STEP; ++u) {
            __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(v[u], 8), bar);
            __m512 kept = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16 * u),
                                        _mm512_maskz_mov_ps(keep, one));
            _mm512_storeu_ps(y + i + 16 * u, _mm512_mul_ps(kept, s));
        }
    }
    apply_any(x + i, y + i, start + i, n - i, key0, key1, threshold, scale);
}
#endif

struct dropout_pass {
    const float *x;
    float *y;
    int32_t start;
    uint32_t key0, key1, threshold;
    float scale;
};

static void apply_part(void *ctx, int64_t lo, int64_t hi)
{
    const struct dropout_pass *p = ctx;
#if HAVE_AVX512
    if (cpu_has_avx512()) {
        apply_avx512(p->x + lo, p->y + lo, p->start + (int32_t)lo, (int32_t)(hi - lo), p->key0,
                     p->key1, p->threshold, p->scale);
        return;
    }
#endif
    apply_any(p->x + lo, p->y + lo, p->start + (int32_t)lo, (int32_t)(hi - lo), p->key0,
              p->key1, p->threshold, p->scale);
}

/* Indices [start, start + n) of x and y, in `parts` parts side by side. */
int dropout_apply(const float *x, float *y, int32_t start, int32_t n, uint32_t key0,
                  uint32_t key1, uint32_t threshold, float scale, int parts)
{
    struct dropout_pass pass = {x + start, y + start, start, key0, key1, threshold, scale};
    run_in_parts(apply_part, &pass, n, parts, 16);
    return 0;
}
