/* 2-D MAX pooling, backward, where 2x2 windows of stride 2 tile the plane (no padding, even
 * sides: VGG's and LeNet's poolings), on AVX2: each input cell lies in one window, so dx is
 * written once, densely, each cell the window's dy where the cell is its winner and 0
 * elsewhere; not zeroed and then scattered into a cell at a time (pooling.c's route_plane:
 * VGG's pools at 23-47% of the memory's rate). The values are Caffe's: its dx, zeroed, gets
 * 0 + dy at the winner (0 + -0 is +0: the sum is made here too, not a copy of dy). Planes
 * that tile lie end to end as one tall plane: a pass over rows of outputs. Returns 0, or -2
 * where it does not serve (another window or stride, padding, odd sides, winners of 4 bytes,
 * rows of fewer than 8 outputs, no AVX2). */
#include <stdint.h>

#include "avx2.h"

/* Rows of fewer outputs stay with the scatter: a row all tail, its cells one at a time, took
 * longer than zeroing and scattering (VGG's pool4, 8x8 -> 4x4: 0.5-0.8 -> 1.6-2.1 ms) */
#define FEW_OUTPUTS 8

#if HAVE_AVX2
/* Output rows `rows` of `ow` each: dy and winners (0..3: row tap * 2 + column tap) -> input
 * rows 2r and 2r + 1 of 2 ow. */
AVX2 static void tiles_backward(const float *dy, const uint8_t *arg, float *dx, int64_t rows,
                                int ow)
{
    const int64_t w = 2 * (int64_t)ow;
    const __m256 zero = _mm256_setzero_ps();
    const __m256i place[4] = {_mm256_set1_epi32(0), _mm256_set1_epi32(1),
                              _mm256_set1_epi32(2), _mm256_set1_epi32(3)};
    for (int64_t r = 0; r < rows; ++r) {
        const float *d = dy + r * ow;
        const uint8_t *a = arg + r * ow;
        float *upper = dx + 2 * r * w, *lower = upper + w;
        int j = 0;
        for (; j + 8 <= ow; j += 8) {
            const __m256 g = _mm256_add_ps(zero, _mm256_loadu_ps(d + j));
            const __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(a + j)));
            __m256 tap[4];
            for (int t = 0; t < 4; ++t)
                tap[t] = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(at, place[t])),
                                       g);
            /* a row's even cells from taps 0 / 2, its odd ones from 1 / 3: interleaved, the
             * 128-bit halves of the unpacks in output order */
            for (int half = 0; half < 2; ++half) {
                const __m256 lo = _mm256_unpacklo_ps(tap[2 * half], tap[2 * half + 1]);
                const __m256 hi = _mm256_unpackhi_ps(tap[2 * half], tap[2 * half + 1]);
                float *to = (half ? lower : upper) + 2 * j;
                _mm256_storeu_ps(to, _mm256_permute2f128_ps(lo, hi, 0x20));
                _mm256_storeu_ps(to + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
            }
        }
        for (; j < ow; ++j)
            for (int t = 0; t < 4; ++t)
                (t < 2 ? upper : lower)[2 * j + (t & 1)] = a[j] == t ? 0.0f + d[j] : 0.0f;
    }
}
#endif

int pool_tiles_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                            int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                            int sh, int sw, int ph, int pw)
{
    if (!cpu_has_avx2() || arg_bytes != 1 || kh != 2 || kw != 2 || sh != 2 || sw != 2 ||
        ph != 0 || pw != 0 || h != 2 * oh || w != 2 * ow || ow < FEW_OUTPUTS)
        return -2;
#if HAVE_AVX2
    tiles_backward(dy, arg, dx, planes * oh, ow);
    return 0;
#else
    (void)dy, (void)arg, (void)dx, (void)planes;
    return -2;
#endif
}
