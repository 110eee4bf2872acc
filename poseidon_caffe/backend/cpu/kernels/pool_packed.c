/* 2-D MAX pooling of rows of 5 to 8 outputs, two planes side by side in a vector (AlexNet's
 * 13x13 pool5, GoogLeNet's 14x14 pool4, VGG's 16x16 pool3 at 64x64), forward, on AVX-512
 * (pooling.c calls it after pool_stride2.c, whose 16 outputs of one row a vector leave most
 * lanes empty on such rows).
 *
 * An output row of two planes is one vector, plane q's outputs in lanes q ow .. q ow + ow - 1.
 * A window row is two vectors, one a plane, each its row's 16 cells from column -pw (cells
 * outside the input load as -inf), loaded once; each column tap is one permute of the two.
 * No layout copy and no transpose: against pool_lanes.c's 16 planes a vector, transposed in
 * and out, 11-15% faster from memory on those three poolings, one thread (rows of 4 outputs
 * or fewer fill 16 lanes there and stay there). 3x3 windows stepping by 2 (padding 0 or 1,
 * winners in bytes) go a window's rows first where the CPU has AVX-512's byte lanes and the
 * planes hold no NaN (packed_rows3): on a Xeon, one thread, AlexNet's 13x13 pool5 0.69 of the
 * time in the L2 cache and 0.85 out of it, GoogLeNet's 14x14 pool4 0.75 and 0.87; CIFAR-10
 * quick's 16x16 pool2 as before.
 *
 * Values are pooling.c's: the window's cells in row-major order from its first cell inside
 * the input (cells outside are -inf, never greater), one taking over only when strictly
 * greater, a NaN becoming the maximum without moving the winner; the winner's place (row tap
 * * kw + column tap) in a byte or an int32. The comparisons that keep NaN's rule run only on
 * the blocks of planes that hold a NaN (one pass over each block first finds which). Returns
 * 0, or -2 where it does not serve (no AVX-512, rows of fewer than 5 or more than 8 outputs,
 * windows reaching past 16 cells, or one that may hold no input cell).
 */
#include <stdint.h>

#include "avx512.h"
#include "max_rows3.h"

#define LANES 16
#define MIN_OUTPUTS 5               /* rows of 4 or fewer: pool_lanes.c ran faster */
#define BLOCK 32                    /* planes whose cells one pass looks through for a NaN */
#define AHEAD 4                     /* planes ahead whose cells are fetched into the cache */

static int serves(int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                  int pw, int arg_bytes)
{
    return HAVE_AVX512 && cpu_has_avx512() && (arg_bytes == 1 || arg_bytes == 4) &&
        ow >= MIN_OUTPUTS && 2 * ow <= LANES && (int64_t)(ow - 1) * sw + kw <= LANES &&
        ph < kh && pw < kw && (int64_t)(oh - 1) * sh - ph < h &&
        (int64_t)(ow - 1) * sw - pw < w;
}

#if HAVE_AVX512
typedef struct {
    int h, w, oh, ow, kh, kw, sh, sw, ph, pw;
    __m512i tap[LANES];         /* column tap t of each lane's output: its cell of the 32 */
    __m512i first;              /* each lane's window's first column tap inside the input */
    __mmask16 cells;            /* a row's 16 cells from column -pw: those inside [0, w) */
} packed;

AVX512 static void packed_init(packed *g)
{
    int32_t index[LANES], first[LANES];
    for (int t = 0; t < g->kw; ++t) {
        for (int l = 0; l < LANES; ++l) {
            int q = l / g->ow, j = l % g->ow;
            index[l] = q < 2 ? q * LANES + j * g->sw + t : 0;
        }
        g->tap[t] = _mm512_loadu_si512(index);
    }
    for (int l = 0; l < LANES; ++l) {
        int left = (l % g->ow) * g->sw - g->pw;
        first[l] = left < 0 ? -left : 0;
    }
    g->first = _mm512_loadu_si512(first);
    int bits = 0;
    for (int l = 0; l < LANES; ++l)
        if (l - g->pw >= 0 && l - g->pw < g->w)
            bits |= 1 << l;
    g->cells = (__mmask16)bits;
}

/* Whether any of n cells from x is a NaN: its bits less the sign above +inf's. Four running
 * maxima side by side (a single chain of compares took a sixth of the pooling's time). */
AVX512 static int holds_nan(const float *x, int64_t n)
{
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 4 * LANES <= n; i += 4 * LANES) {
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
        m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), magnitude));
        m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), magnitude));
        m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), magnitude));
    }
    for (; i < n; i += LANES)
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(
            _mm512_maskz_loadu_epi32(first_lanes(n - i), x + i), magnitude));
    m0 = _mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3));
    return _mm512_cmpgt_epu32_mask(m0, _mm512_set1_epi32(0x7f800000)) != 0;
}

/* Output row i of `planes` (1 or 2) planes from xp. Inlined with constant kw and with_nan
 * (NaN's comparisons or not), so the taps unroll. */
AVX512 static inline __attribute__((always_inline)) void
packed_row(const packed *g, const float *xp, int planes, int i, float *yp, void *argp,
           int arg_bytes, int kw, int with_nan)
{
    const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
    const int64_t plane = (int64_t)g->h * g->w;
    const int top = i * g->sh - g->ph;
    const int a0 = top < 0 ? -top : 0;
    const int a1 = top + g->kh > g->h ? g->h - top : g->kh;
    __m512i at = _mm512_add_epi32(g->first, _mm512_set1_epi32(a0 * kw));
    __m512 best = lowest;
    for (int a = a0; a < a1; ++a) {
        const float *row = xp + (int64_t)(top + a) * g->w - g->pw;
        const __m512 v0 = _mm512_mask_loadu_ps(lowest, g->cells, row);
        const __m512 v1 = _mm512_mask_loadu_ps(lowest, planes > 1 ? g->cells : 0, row + plane);
#pragma GCC unroll 16
        for (int t = 0; t < kw; ++t) {
            const __m512 value = _mm512_permutex2var_ps(v0, g->tap[t], v1);
            const __mmask16 greater = _mm512_cmp_ps_mask(value, best, _CMP_GT_OQ);
            __mmask16 take = greater;
            if (with_nan)
                take |= _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
            best = _mm512_mask_mov_ps(best, take, value);
            at = _mm512_mask_mov_epi32(at, greater, _mm512_set1_epi32(a * kw + t));
        }
    }
    /* lane q ow + j is output (i, j) of plane q: each plane's lanes stored from an address
     * q ow cells before its row (the lanes before them masked off) */
    const int64_t outputs = (int64_t)g->oh * g->ow;
    for (int q = 0; q < planes; ++q) {
        const __mmask16 lanes = (__mmask16)(first_lanes(g->ow) << (q * g->ow));
        const int64_t out = q * outputs + (int64_t)i * g->ow - q * g->ow;
        _mm512_mask_storeu_ps(yp + out, lanes, best);
        if (arg_bytes == 1)
            _mm512_mask_cvtepi32_storeu_epi8((uint8_t *)argp + out, lanes, at);
        else
            _mm512_mask_storeu_epi32((int32_t *)argp + out, lanes, at);
    }
}

/* The results of a row of `planes` planes (`row` plane 0's cell 0) for 3x3 windows stepping
 * by 2: *value, the first maximum of each output's three cells in the row, and *column, its
 * column tap. `inside`: the lanes whose tap 0 lies inside the row. */
AVX512BW static inline __attribute__((always_inline)) void
packed_row3(const packed *g, const float *row, int planes, __mmask16 inside, __m512 *value,
            __m128i *column)
{
    const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
    const int64_t plane = (int64_t)g->h * g->w;
    const __m512 v0 = _mm512_mask_loadu_ps(lowest, g->cells, row - g->pw);
    const __m512 v1 = _mm512_mask_loadu_ps(lowest, planes > 1 ? g->cells : 0,
                                           row + plane - g->pw);
    const __m512 t0 = _mm512_permutex2var_ps(v0, g->tap[0], v1);
    const __m512 t1 = _mm512_permutex2var_ps(v0, g->tap[1], v1);
    const __m512 t2 = _mm512_permutex2var_ps(v0, g->tap[2], v1);
    const __m128i none = _mm_setzero_si128();
    *value = first_of_three(t0, t1, t2, none, none, none, (__mmask16)~inside, 1, column);
}

/* Every output row of two planes (one at the end of an odd count) for 3x3 windows stepping
 * by 2 (padding 0 or 1, winners in bytes, no NaN), a window's rows first: each output row
 * takes its three rows' results (a later row only where strictly greater) and keeps the last
 * for the next output row, whose first it is; 6 permutes and 4 comparisons an output row where
 * the taps took 9 and 9. The first maximum in row-major order is the first, in row order, of
 * the rows' first maxima; a window's first cell inside is its first row's first inside. */
AVX512BW static void packed_rows3(const packed *g, const float *xp, int planes, float *yp,
                                  uint8_t *argp)
{
    const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
    const __mmask16 inside = _mm512_cmpeq_epi32_mask(g->first, _mm512_setzero_si512());
    const int64_t outputs = (int64_t)g->oh * g->ow;
    __m512 kept = lowest;
    __m128i kept_column = _mm_setzero_si128();
    for (int i = 0; i < g->oh; ++i) {
        const int top = 2 * i - g->ph;
        __m512 upper = lowest, middle = lowest, lower = lowest;
        __m128i upper_at = _mm_setzero_si128(), middle_at = upper_at, lower_at = upper_at;
        if (i > 0)
            upper = kept, upper_at = kept_column;
        else if (top >= 0)
            packed_row3(g, xp + (int64_t)top * g->w, planes, inside, &upper, &upper_at);
        if (top + 1 < g->h)
            packed_row3(g, xp + (int64_t)(top + 1) * g->w, planes, inside, &middle, &middle_at);
        if (top + 2 < g->h)
            packed_row3(g, xp + (int64_t)(top + 2) * g->w, planes, inside, &lower, &lower_at);
        kept = lower;
        kept_column = lower_at;
        __m128i at;
        const __m512 y = first_of_three(upper, middle, lower, upper_at, middle_at, lower_at,
                                        (__mmask16)(top < 0 ? 0xFFFF : 0), 3, &at);
        for (int q = 0; q < planes; ++q) {
            const __mmask16 lanes = (__mmask16)(first_lanes(g->ow) << (q * g->ow));
            const int64_t out = q * outputs + (int64_t)i * g->ow - q * g->ow;
            _mm512_mask_storeu_ps(yp + out, lanes, y);
            _mm_mask_storeu_epi8(argp + out, lanes, at);
        }
    }
}

/* Every output row of two planes (one at the end of an odd count). */
AVX512 static inline __attribute__((always_inline)) void
packed_rows(const packed *g, const float *xp, int planes, float *yp, void *argp,
            int arg_bytes, int kw, int nan)
{
    if (nan) {
        for (int i = 0; i < g->oh; ++i)
            packed_row(g, xp, planes, i, yp, argp, arg_bytes, kw, 1);
    } else {
        for (int i = 0; i < g->oh; ++i)
            packed_row(g, xp, planes, i, yp, argp, arg_bytes, kw, 0);
    }
}

AVX512 static int packed_forward(packed *g, const float *x, float *y, void *arg,
                                 int arg_bytes, int64_t planes)
{
    packed_init(g);
    const int64_t plane = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    const int rows3 = g->kh == 3 && g->kw == 3 && g->sh == 2 && g->sw == 2 && g->ph <= 1 &&
        g->pw <= 1 && arg_bytes == 1 && cpu_has_avx512bw();
    int nan = 0;
    for (int64_t p = 0; p < planes; p += 2) {
        const int n = planes - p < 2 ? 1 : 2;
        const float *xp = x + p * plane;
        if (p % BLOCK == 0)
            nan = holds_nan(xp, (planes - p < BLOCK ? planes - p : BLOCK) * plane);
        /* the planes after next on their way while these are compared (from memory, one
         * thread: AlexNet's pool5 1147 -> 989 us) */
        if (p + AHEAD + 2 <= planes)
            for (int64_t c = 0; c < 2 * plane; c += LANES)
                _mm_prefetch((const char *)(xp + AHEAD * plane + c), _MM_HINT_T0);
        float *yp = y + p * outputs;
        void *ap = (char *)arg + p * outputs * arg_bytes;
        if (rows3 && !nan)
            packed_rows3(g, xp, n, yp, ap);
        else if (g->kw == 3)
            packed_rows(g, xp, n, yp, ap, arg_bytes, 3, nan);
        else if (g->kw == 2)
            packed_rows(g, xp, n, yp, ap, arg_bytes, 2, nan);
        else
            packed_rows(g, xp, n, yp, ap, arg_bytes, g->kw, nan);
    }
    return 0;
}
#endif

int pool_packed_max_forward(const float *x, float *y, void *arg, int arg_bytes,
                            int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                            int sh, int sw, int ph, int pw)
{
    if (!serves(h, w, oh, ow, kh, kw, sh, sw, ph, pw, arg_bytes))
        return -2;
#if HAVE_AVX512
    packed g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    return packed_forward(&g, x, y, arg, arg_bytes, planes);
#endif
    return -2;
}
