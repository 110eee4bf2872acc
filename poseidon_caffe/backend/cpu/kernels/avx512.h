/* AVX-512 where the compiler can target it, for the kernels with hand-written vector paths
 * (direct.c, pool_lanes.c, winograd.c, lrn.c, ...): HAVE_AVX512, the AVX512 function attribute,
 * first_lanes(), and cpu_has_avx512(), whether the CPU running the library has it (asked
 * once). */
#ifndef POSEIDON_AVX512_H
#define POSEIDON_AVX512_H

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#define HAVE_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
/* with AVX-512's byte and word lanes, its 128- and 256-bit forms and a prefetch for writing
 * (every AVX-512 CPU but the Xeon Phi's): cpu_has_avx512bw() */
#define AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl,prfchw")))

/* The first n of a vector's 16 lanes (all of them from 16 on): a pass's last, short vector. */
static inline __mmask16 first_lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

static inline int cpu_has_avx512(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return known;
}

static inline int cpu_has_avx512bw(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") ? 1 : 0;
    }
    return known;
}
#else
#define HAVE_AVX512 0

static inline int cpu_has_avx512(void)
{
    return 0;
}

static inline int cpu_has_avx512bw(void)
{
    return 0;
}
#endif

#endif
