/* AVX2 where the compiler can target it, for the passes written for CPUs that have AVX2 but
 * not AVX-512 (pool_lanes8.c, pool_rows.c, ...): HAVE_AVX2, the AVX2 function attribute,
 * first_lanes8(), cpu_has_avx2(), whether the CPU running the library has it (asked once),
 * and cpu_has_fma(). */
#ifndef POSEIDON_AVX2_H
#define POSEIDON_AVX2_H

#include "avx512.h"

/* avx512.h's test of the compiler (GCC on x86-64) is AVX2's too */
#define HAVE_AVX2 HAVE_AVX512
#if HAVE_AVX2
#define AVX2 __attribute__((target("avx2")))

/* The first n of 8 lanes (all from 8 on), as a mask of maskload, maskstore and blendv */
AVX2 static inline __m256i first_lanes8(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n >= 8 ? 8 : (int)n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

static inline int cpu_has_avx2(void)
{
#if HAVE_AVX2
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
#else
    return 0;
#endif
}

/* Whether that CPU has the fused multiply-add too (lrn.c's AVX2 roots use it), asked once */
static inline int cpu_has_fma(void)
{
#if HAVE_AVX2
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("fma") ? 1 : 0;
    }
    return known;
#else
    return 0;
#endif
}

#endif
