/* One tap of MAX pooling for 8 lanes on AVX2, the rule every pass keeps (pool_lanes8.c,
 * pool_tiles.c): the tap's value takes over where strictly greater (the winner, place()'s int32
 * bits in a float vector, moves) or where it is NaN (the winner stays). */
#ifndef POSEIDON_MAX_TAP8_H
#define POSEIDON_MAX_TAP8_H

#include "avx2.h"

#if HAVE_AVX2
/* A winner's place as MAX_TAP8 keeps it: int32 bits in a float vector */
AVX2 static inline __m256 place(int p)
{
    return _mm256_castsi256_ps(_mm256_set1_epi32(p));
}
#endif

#define MAX_TAP8(best, at, value, tap)                                                   \
    do {                                                                                 \
        const __m256 greater_ = _mm256_cmp_ps(value, best, _CMP_GT_OQ);                  \
        const __m256 nan_ = _mm256_cmp_ps(value, value, _CMP_UNORD_Q);                   \
        best = _mm256_blendv_ps(best, value, _mm256_or_ps(greater_, nan_));              \
        at = _mm256_blendv_ps(at, tap, greater_);                                        \
    } while (0)

#endif
