/* MAX pooling's 3x3 windows a window's rows first (pool_same.c, pool_stride2.c,
 * pool_packed.c, AVX-512 with byte lanes): the step that both a row's three cells and an
 * output's three rows take. */
#ifndef POSEIDON_MAX_ROWS3_H
#define POSEIDON_MAX_ROWS3_H

#include "avx512.h"

#if HAVE_AVX512
/* The first maximum of a, b and c in that order (a later one taking over only where strictly
 * greater) and, in *at, its place: a_at, b_at + step or c_at + 2 step. b's where a is padding
 * (`a_outside`: -inf there, the window's first inside is b). max(later, earlier) is the
 * earlier where they are equal, as -0 and +0 are: the winner's own value. */
AVX512BW static inline __attribute__((always_inline)) __m512
first_of_three(__m512 a, __m512 b, __m512 c, __m128i a_at, __m128i b_at, __m128i c_at,
               __mmask16 a_outside, char step, __m128i *at)
{
    const __mmask16 second = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | a_outside;
    const __m512 best = _mm512_max_ps(b, a);
    const __mmask16 third = _mm512_cmp_ps_mask(c, best, _CMP_GT_OQ);
    *at = _mm_mask_add_epi8(_mm_mask_add_epi8(a_at, second, b_at, _mm_set1_epi8(step)), third,
                            c_at, _mm_set1_epi8((char)(2 * step)));
    return _mm512_max_ps(c, best);
}
#endif

#endif
