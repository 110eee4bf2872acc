/* Compiled local response normalisation across channels (lrn.py), Caffe's formulas:
 *
 *     scale = k + alpha/size * sum of x^2 over the size channels centred on c (zero past
 *             the ends),  top = x * scale^-beta,
 *     dx    = dy * scale^-beta - 2 alpha beta/size * x * sum over the same window of
 *             dy * top / scale.
 *
 * numpy makes these as a dozen whole-array passes (squares, shifted adds, powers, products);
 * here each image is one pass over its planes, the window's planes read from cache, every
 * loop running over the positions of a plane on vectors. The scale need not be kept from
 * forward to backward: the backward remakes it from x, an image at a time. Arrays are
 * C-contiguous float32 (n, channels, positions). The plane loops are calls of their own, built
 * for AVX2 and AVX-512 too (VECTOR_LOOP), and the square roots are the vector instruction
 * (setup.py builds with -fno-math-errno: a root of a negative is NaN, errno is not set).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "avx2.h"
#include "vector_loop.h"

/* scale^-beta, with the square-root forms of Caffe's usual betas */
VECTOR_LOOP
static void negative_power_exact(const float *restrict s, float *restrict out, int64_t count,
                                 float beta)
{
    if (beta == 0.75f) {
        for (int64_t p = 0; p < count; ++p) {
            const float r = sqrtf(s[p]);
            out[p] = 1.0f / (r * sqrtf(r));
        }
    } else if (beta == 0.5f) {
        for (int64_t p = 0; p < count; ++p)
            out[p] = 1.0f / sqrtf(s[p]);
    } else {
        for (int64_t p = 0; p < count; ++p)
            out[p] = powf(s[p], -beta);
    }
}

/* The prefetch, a line at a time (every other vector of 8, every vector of 16), of a plane
 * a later pass reads from memory: the backward's passes read three planes of some KB from
 * three places, too short a stream each for the hardware's prefetcher to learn, and a core
 * waiting on one plane's misses at a time stays well under the copy rate (GoogLeNet's
 * norm2, one thread on an EPYC: 31 -> 24 ms). */
#define PREFETCH_AHEAD(ahead, p)                                                           \
    do {                                                                                   \
        if ((ahead) != NULL && ((p) & 15) == 0)                                            \
            __builtin_prefetch((ahead) + (p), 0, 3);                                       \
    } while (0)

#if HAVE_AVX512
/* 1/sqrt(v) for v in (2^-100, 2^100): the 14-bit estimate and one Newton step (relative
 * error near 2^-23, against a division and a square root of some 20 cycles a vector) */
AVX512 static inline __m512 reciprocal_root(__m512 v)
{
    const __m512 r = _mm512_rsqrt14_ps(v);
    const __m512 half_v_r = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.5f)), r);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(half_v_r, r, _mm512_set1_ps(1.5f)));
}

/* scale^-0.75 = r^1.5 with r = scale^-0.5, or scale^-0.5 = r, of 16 cells; when one is
 * outside (2^-100, 2^100) (never with k >= 1e-30: the scale is at least k) the 16 go the exact
 * way. Within 4 ulp of the exact forms (themselves rounded three times; beta 0.75 3.9 at
 * worst over 7M scales on a Xeon, 0.5 2.2): the tests' 1e-5 is twenty times wider. */
AVX512 static inline __m512 negative_power16(__m512 scale, int three_quarters)
{
    const __mmask16 inside = _mm512_cmp_ps_mask(scale, _mm512_set1_ps(0x1p-100f), _CMP_GT_OQ) &
                             _mm512_cmp_ps_mask(scale, _mm512_set1_ps(0x1p100f), _CMP_LT_OQ);
    if (inside != 0xFFFF) {
        float cells[16], powers[16];
        _mm512_storeu_ps(cells, scale);
        negative_power_exact(cells, powers, 16, three_quarters ? 0.75f : 0.5f);
        return _mm512_loadu_ps(powers);
    }
    const __m512 r = reciprocal_root(scale);
    return three_quarters ? _mm512_mul_ps(_mm512_mul_ps(r, r), reciprocal_root(r)) : r;
}

/* negative_power16 over the cells, the last few (under 16) the exact way. */
AVX512 static void negative_power_roots(const float *s, float *out, int64_t count,
                                        int three_quarters)
{
    int64_t p = 0;
    for (; p + 16 <= count; p += 16)
        _mm512_storeu_ps(out + p, negative_power16(_mm512_loadu_ps(s + p), three_quarters));
    negative_power_exact(s + p, out + p, count - p, three_quarters ? 0.75f : 0.5f);
}
#endif

#if HAVE_AVX2
/* AVX2 with the fused multiply-add, which every AVX2 CPU but a rare few has (roots_lanes
 * asks the CPU for both) */
#define AVX2_FMA __attribute__((target("avx2,fma")))

/* r refined by a Newton step towards 1/sqrt(v) */
AVX2_FMA static inline __m256 newton_root8(__m256 v, __m256 r)
{
    const __m256 half_v_r = _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(0.5f)), r);
    return _mm256_mul_ps(r, _mm256_sub_ps(_mm256_set1_ps(1.5f), _mm256_mul_ps(half_v_r, r)));
}

/* 1/sqrt(v) for v in (2^-100, 2^100): the 12-bit estimate and one Newton step (relative
 * error near 2^-22; a square root and a division take some 20 cycles a vector on an EPYC,
 * and a second step cost all the gain) */
AVX2_FMA static inline __m256 reciprocal_root8(__m256 v)
{
    return newton_root8(v, _mm256_rsqrt_ps(v));
}

/* scale^-0.75 of 8 cells inside (2^-100, 2^100). The estimates a of scale^-1/2 and b of
 * a^-1/2 give y = a^2 b within 1e-3; then y E^-1/4 by its series to the square, where
 * E = scale^3 y^4 (made as (scale y)^2 (scale y) y: nothing overflows) is near 1, the error
 * left some 0.12 |E - 1|^3, under 1e-8: within 2 ulp of the exact value on an EPYC, where
 * two roots each refined by a Newton step were within 4. And it is 11 steps of the
 * multiplier a vector, where those were 13: the forward's powers are bound there. */
AVX2_FMA static inline __m256 three_quarter_power8(__m256 scale)
{
    const __m256 a = _mm256_rsqrt_ps(scale);
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(a, a), _mm256_rsqrt_ps(a));
    const __m256 u = _mm256_mul_ps(scale, y);
    const __m256 e = _mm256_mul_ps(_mm256_mul_ps(u, u), _mm256_mul_ps(u, y));
    const __m256 series = _mm256_fmadd_ps(_mm256_fmadd_ps(e, _mm256_set1_ps(5.0f / 32),
                                                          _mm256_set1_ps(-18.0f / 32)),
                                          e, _mm256_set1_ps(45.0f / 32));
    return _mm256_mul_ps(y, series);
}

/* negative_power8 of 8 cells all inside (2^-100, 2^100) */
AVX2_FMA static inline __m256 negative_power8_inside(__m256 scale, int three_quarters)
{
    return three_quarters ? three_quarter_power8(scale) : reciprocal_root8(scale);
}

/* Whether 8 cells are all inside (2^-100, 2^100), as lanes of all ones */
AVX2_FMA static inline __m256 inside8(__m256 scale)
{
    return _mm256_and_ps(_mm256_cmp_ps(scale, _mm256_set1_ps(0x1p-100f), _CMP_GT_OQ),
                         _mm256_cmp_ps(scale, _mm256_set1_ps(0x1p100f), _CMP_LT_OQ));
}

/* negative_power16's for 8 cells, on AVX2: within 5 ulp of the exact forms (beta 0.5: the
 * 12-bit estimate's step leaves more than the 14-bit one's; 0.75 within 2 of the true
 * value, three_quarter_power8) */
AVX2_FMA static inline __m256 negative_power8(__m256 scale, int three_quarters)
{
    if (_mm256_movemask_ps(inside8(scale)) != 0xFF) {
        float cells[8], powers[8];
        _mm256_storeu_ps(cells, scale);
        negative_power_exact(cells, powers, 8, three_quarters ? 0.75f : 0.5f);
        return _mm256_loadu_ps(powers);
    }
    return negative_power8_inside(scale, three_quarters);
}

/* negative_power8 over the cells, the last few (under 8) the exact way. */
AVX2_FMA static void negative_power_roots8(const float *s, float *out, int64_t count,
                                       int three_quarters)
{
    int64_t p = 0;
    for (; p + 8 <= count; p += 8)
        _mm256_storeu_ps(out + p, negative_power8(_mm256_loadu_ps(s + p), three_quarters));
    negative_power_exact(s + p, out + p, count - p, three_quarters ? 0.75f : 0.5f);
}
#endif

/* 1 (the default): beta 0.75 and 0.5 by reciprocal-root estimates refined once, where the
 * CPU has AVX-512 or AVX2; 0: by square roots and a division everywhere (the tests run
 * both) */
int lrn_fast_roots = 1;

/* Which of the roots' passes serve: 16 cells a vector (AVX-512), 8 (AVX2), or none (0). */
static int roots_lanes(float beta)
{
    if (!lrn_fast_roots || (beta != 0.75f && beta != 0.5f))
        return 0;
    return cpu_has_avx512() ? 16 : cpu_has_avx2() && cpu_has_fma() ? 8 : 0;
}

/* roots_lanes for Caffe's usual beta: the tests' bound on the roots' error follows it */
int lrn_roots_lanes(void)
{
    return roots_lanes(0.75f);
}

static void negative_power(const float *restrict s, float *restrict out, int64_t count,
                           float beta)
{
    const int lanes = roots_lanes(beta);
#if HAVE_AVX512
    if (lanes == 16) {
        negative_power_roots(s, out, count, beta == 0.75f);
        return;
    }
#endif
#if HAVE_AVX2
    if (lanes == 8) {
        negative_power_roots8(s, out, count, beta == 0.75f);
        return;
    }
#endif
    (void)lanes;
    negative_power_exact(s, out, count, beta);
}

/* to = 0 over n cells */
VECTOR_LOOP
static void zero(float *restrict to, int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = 0.0f;
}

/* to += from^2 over n cells */
VECTOR_LOOP
static void add_squares(float *restrict to, const float *restrict from, int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] += from[p] * from[p];
}

/* to += from over n cells */
VECTOR_LOOP
static void add(float *restrict to, const float *restrict from, int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] += from[p];
}

/* to = to * coef + k over n cells */
VECTOR_LOOP
static void scale_shift(float *restrict to, float coef, float k, int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = to[p] * coef + k;
}

/* to = a * b over n cells */
VECTOR_LOOP
static void multiply(const float *restrict a, const float *restrict b, float *restrict to,
                     int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = a[p] * b[p];
}

/* to = a * b / c over n cells */
VECTOR_LOOP
static void product_over(const float *restrict a, const float *restrict b,
                         const float *restrict c, float *restrict to, int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = a[p] * b[p] / c[p];
}

/* to = dy * power - coef * x * acc over n cells: the backward's last step */
VECTOR_LOOP
static void backward_cells(const float *restrict dy, const float *restrict power,
                           const float *restrict x, const float *restrict acc, float coef,
                           float *restrict to, int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = dy[p] * power[p] - coef * x[p] * acc[p];
}

/* to = (a^2 + b^2 + c^2 + d^2 + e^2) * coef + k over n cells, added left to right: a window
 * of five planes in one pass */
VECTOR_LOOP
static void five_squares(const float *restrict a, const float *restrict b,
                         const float *restrict c, const float *restrict d,
                         const float *restrict e, float coef, float k, float *restrict to,
                         int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = ((((a[p] * a[p] + b[p] * b[p]) + c[p] * c[p]) + d[p] * d[p]) + e[p] * e[p]) *
            coef + k;
}

/* to = a + b + c + d + e over n cells, added left to right */
VECTOR_LOOP
static void five_sum(const float *restrict a, const float *restrict b, const float *restrict c,
                     const float *restrict d, const float *restrict e, float *restrict to,
                     int64_t n)
{
    for (int64_t p = 0; p < n; ++p)
        to[p] = (((a[p] + b[p]) + c[p]) + d[p]) + e[p];
}

/* The five planes of a window, `zeros` (a plane of 0) standing for channels past either end,
 * moved ahead of the others: adding 0 first changes no sum, so the sums are those of the
 * plane-at-a-time loop from 0. */
static void zeros_first(const float *w[5], const float *zeros)
{
    const float *planes[5];
    int count = 0;
    for (int q = 0; q < 5; ++q)
        if (w[q] != zeros)
            planes[count++] = w[q];
    for (int q = 0; q < 5; ++q)
        w[q] = q < 5 - count ? zeros : planes[q - (5 - count)];
}

/* The window of channel c, size 5 (Caffe's usual), in channel order from `planes`. */
static void window_of_five(const float *planes, const float *zeros, int c, int channels,
                           int64_t positions, const float *w[5])
{
    for (int q = 0; q < 5; ++q) {
        int d = c - 2 + q;
        w[q] = d < 0 || d >= channels ? zeros : planes + (int64_t)d * positions;
    }
    zeros_first(w, zeros);
}

/* scale of channel c of one image: k + alpha/size * the window's sum of squares */
static void window_scale(const float *restrict xi, float *restrict sc, int c, int channels,
                         int64_t positions, int size, float coef, float k,
                         const float *zeros)
{
    if (size == 5 && zeros != NULL) {
        const float *w[5];
        window_of_five(xi, zeros, c, channels, positions, w);
        five_squares(w[0], w[1], w[2], w[3], w[4], coef, k, sc, positions);
        return;
    }
    const int half = (size - 1) / 2;
    const int lo = c - half < 0 ? 0 : c - half;
    const int hi = c + half >= channels ? channels - 1 : c + half;
    zero(sc, positions);
    for (int d = lo; d <= hi; ++d)
        add_squares(sc, xi + (int64_t)d * positions, positions);
    scale_shift(sc, coef, k, positions);
}

#if HAVE_AVX512
/* One channel's forward, window of five and beta 0.75 or 0.5 by the roots, in one pass over
 * its positions (the three loops five_squares, negative_power and multiply, each a pass over
 * the plane, would read and write it three times): the same operations in the same order
 * (no fused multiply-add, as the plain loops are built), so the same values to the bit. */
AVX512 static void five_forward_roots(const float *w[5], const float *restrict xc, float coef,
                                      float k, float *restrict sc, float *restrict top,
                                      int64_t n, int three_quarters)
{
    const __m512 cv = _mm512_set1_ps(coef), kv = _mm512_set1_ps(k);
    const float beta = three_quarters ? 0.75f : 0.5f;
    int64_t p = 0;
    for (; p + 16 <= n; p += 16) {
        __m512 v = _mm512_loadu_ps(w[0] + p), sum = _mm512_mul_ps(v, v);
        for (int q = 1; q < 5; ++q) {
            v = _mm512_loadu_ps(w[q] + p);
            sum = _mm512_add_ps(sum, _mm512_mul_ps(v, v));
        }
        const __m512 scale = _mm512_add_ps(_mm512_mul_ps(sum, cv), kv);
        if (sc != NULL)
            _mm512_storeu_ps(sc + p, scale);
        const __m512 power = negative_power16(scale, three_quarters);
        _mm512_storeu_ps(top + p, _mm512_mul_ps(_mm512_loadu_ps(xc + p), power));
    }
    for (; p < n; ++p) {         /* the last few as negative_power_roots: the exact forms */
        float sum = w[0][p] * w[0][p];
        for (int q = 1; q < 5; ++q)
            sum = sum + w[q][p] * w[q][p];
        float scale = sum * coef + k, power;
        if (sc != NULL)
            sc[p] = scale;
        negative_power_exact(&scale, &power, 1, beta);
        top[p] = xc[p] * power;
    }
}

/* The backward's last steps for one channel, window of five and beta 0.75 or 0.5 by the
 * roots, in one pass: the window's ratios summed (five_sum), scale^-beta (negative_power) and
 * dx (backward_cells), the same operations in the same order, so the same values to the
 * bit. */
AVX512 static void five_backward_roots(const float *w[5], const float *restrict sc,
                                       const float *restrict dy, const float *restrict x,
                                       float coef, float *restrict dx, int64_t n,
                                       int three_quarters, const float *const ahead[3])
{
    const __m512 cv = _mm512_set1_ps(coef);
    const float beta = three_quarters ? 0.75f : 0.5f;
    int64_t p = 0;
    for (; p + 16 <= n; p += 16) {
        for (int f = 0; f < 3; ++f)
            PREFETCH_AHEAD(ahead[f], p);
        __m512 acc = _mm512_loadu_ps(w[0] + p);
        for (int q = 1; q < 5; ++q)
            acc = _mm512_add_ps(acc, _mm512_loadu_ps(w[q] + p));
        const __m512 power = negative_power16(_mm512_loadu_ps(sc + p), three_quarters);
        const __m512 kept = _mm512_mul_ps(_mm512_loadu_ps(dy + p), power);
        const __m512 spread = _mm512_mul_ps(_mm512_mul_ps(cv, _mm512_loadu_ps(x + p)), acc);
        _mm512_storeu_ps(dx + p, _mm512_sub_ps(kept, spread));
    }
    for (; p < n; ++p) {         /* the last few as negative_power_roots: the exact forms */
        float acc = w[0][p], power;
        for (int q = 1; q < 5; ++q)
            acc = acc + w[q][p];
        negative_power_exact(sc + p, &power, 1, beta);
        dx[p] = dy[p] * power - coef * x[p] * acc;
    }
}
#endif

#if HAVE_AVX2
/* five_backward_roots on AVX2, 8 cells a vector: the same operations in the same order */
AVX2_FMA static void five_backward_roots8(const float *w[5], const float *restrict sc,
                                      const float *restrict dy, const float *restrict x,
                                      float coef, float *restrict dx, int64_t n,
                                      int three_quarters, const float *const ahead[3])
{
    const __m256 cv = _mm256_set1_ps(coef);
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        for (int f = 0; f < 3; ++f)
            PREFETCH_AHEAD(ahead[f], p);
        __m256 acc = _mm256_loadu_ps(w[0] + p);
        for (int q = 1; q < 5; ++q)
            acc = _mm256_add_ps(acc, _mm256_loadu_ps(w[q] + p));
        const __m256 power = negative_power8(_mm256_loadu_ps(sc + p), three_quarters);
        const __m256 kept = _mm256_mul_ps(_mm256_loadu_ps(dy + p), power);
        const __m256 spread = _mm256_mul_ps(_mm256_mul_ps(cv, _mm256_loadu_ps(x + p)), acc);
        _mm256_storeu_ps(dx + p, _mm256_sub_ps(kept, spread));
    }
    for (; p < n; ++p) {         /* the last few as negative_power_roots8: the exact forms */
        float acc = w[0][p], power;
        for (int q = 1; q < 5; ++q)
            acc = acc + w[q][p];
        negative_power_exact(sc + p, &power, 1, three_quarters ? 0.75f : 0.5f);
        dx[p] = dy[p] * power - coef * x[p] * acc;
    }
}

/* to = from^2 over n cells */
AVX2 static void squares8(const float *restrict from, float *restrict to, int64_t n)
{
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        const __m256 v = _mm256_loadu_ps(from + p);
        _mm256_storeu_ps(to + p, _mm256_mul_ps(v, v));
    }
    for (; p < n; ++p)
        to[p] = from[p] * from[p];
}

/* The window's sum of squares at p, its last square made from `fresh` (when not NULL) into
 * `fresh_sq`, the others read from sq[0..3]: five_squares' sum, added left to right (the
 * last few cells of a plane, one at a time) */
static inline float window_squares1(const float *sq[5], const float *restrict fresh,
                                    float *restrict fresh_sq, int64_t p)
{
    float last;
    if (fresh != NULL)
        fresh_sq[p] = last = fresh[p] * fresh[p];
    else
        last = sq[4][p];
    float sum = sq[0][p];
    for (int q = 1; q < 4; ++q)
        sum = sum + sq[q][p];
    return sum + last;
}

/* Cells a piece of a plane: the pass below makes a piece's scales first, then their powers
 * (a long chain of dependent steps: in one loop with the sums, fewer vectors overlap in the
 * core; apart, 6% faster on an EPYC), the range of the roots checked once a piece. */
#define ROOTS_PIECE 128

/* The bit patterns of 2^-100 and 2^100. As 32-bit integers, positive floats are in their
 * patterns' order, negative ones below 0 and positive NaN above infinity: a scale is inside
 * (2^-100, 2^100) when its pattern is inside these, which a piece's lowest and highest
 * pattern tell (two integer steps a vector where the comparisons of inside8 took four). */
#define INSIDE_LOW 0x0D800000
#define INSIDE_HIGH 0x71800000

/* One channel's forward on AVX2 from its window's squares, each square made once, not once
 * for each of the five windows it is in: five_squares' sums and scales, so their values to
 * the bit, and the powers of negative_power_roots8. `entering` and `three_quarters` are
 * constants in each copy of this (five_forward_squares8), so the loops test neither. */
AVX2_FMA static inline __attribute__((always_inline)) void
five_forward_pieces8(const float *sq[5], const float *restrict fresh, float *restrict fresh_sq,
                     const float *restrict xc, float coef, float k, float *restrict sc,
                     float *restrict top, int64_t n, const int entering,
                     const int three_quarters)
{
    /* the pointers apart, else each store would make the loop read them again */
    const float *restrict sq0 = sq[0], *restrict sq1 = sq[1], *restrict sq2 = sq[2],
                *restrict sq3 = sq[3], *restrict sq4 = sq[4];
    const __m256 cv = _mm256_set1_ps(coef), kv = _mm256_set1_ps(k);
    float scales[ROOTS_PIECE] __attribute__((aligned(32)));
    int64_t p = 0;
    while (p + 8 <= n) {
        const int64_t end = p + (n - p < ROOTS_PIECE ? (n - p) & ~(int64_t)7 : ROOTS_PIECE);
        __m256i lowest = _mm256_set1_epi32(INT32_MAX), highest = _mm256_set1_epi32(INT32_MIN);
        float *kept = sc != NULL ? sc + p : scales;     /* the piece's scales, from kept[0] */
        for (int64_t q = p; q < end; q += 8) {
            __m256 last;
            if (entering) {
                const __m256 v = _mm256_loadu_ps(fresh + q);
                last = _mm256_mul_ps(v, v);
                _mm256_storeu_ps(fresh_sq + q, last);
            } else {
                last = _mm256_loadu_ps(sq4 + q);
            }
            __m256 sum = _mm256_add_ps(_mm256_loadu_ps(sq0 + q), _mm256_loadu_ps(sq1 + q));
            sum = _mm256_add_ps(_mm256_add_ps(sum, _mm256_loadu_ps(sq2 + q)),
                                _mm256_loadu_ps(sq3 + q));
            const __m256 scale = _mm256_add_ps(_mm256_mul_ps(_mm256_add_ps(sum, last), cv), kv);
            _mm256_storeu_ps(kept + (q - p), scale);
            lowest = _mm256_min_epi32(lowest, _mm256_castps_si256(scale));
            highest = _mm256_max_epi32(highest, _mm256_castps_si256(scale));
        }
        const __m256i inside = _mm256_and_si256(
            _mm256_cmpgt_epi32(lowest, _mm256_set1_epi32(INSIDE_LOW)),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(INSIDE_HIGH), highest));
        const int checked = _mm256_movemask_ps(_mm256_castsi256_ps(inside)) != 0xFF;
        for (int64_t q = p; q < end; q += 8) {
            const __m256 scale = _mm256_loadu_ps(kept + (q - p));
            const __m256 power = checked ? negative_power8(scale, three_quarters) :
                negative_power8_inside(scale, three_quarters);
            _mm256_storeu_ps(top + q, _mm256_mul_ps(_mm256_loadu_ps(xc + q), power));
        }
        p = end;
    }
    for (; p < n; ++p) {         /* the last few as negative_power_roots8: the exact forms */
        float scale = window_squares1(sq, entering ? fresh : NULL, fresh_sq, p) * coef + k;
        float power;
        if (sc != NULL)
            sc[p] = scale;
        negative_power_exact(&scale, &power, 1, three_quarters ? 0.75f : 0.5f);
        top[p] = xc[p] * power;
    }
}

/* five_forward_pieces8 with a square entering (`fresh` not NULL) or not, beta 0.75 or 0.5 */
AVX2_FMA static void five_forward_squares8(const float *sq[5], const float *restrict fresh,
                                           float *restrict fresh_sq, const float *restrict xc,
                                           float coef, float k, float *restrict sc,
                                           float *restrict top, int64_t n, int three_quarters)
{
    if (fresh != NULL && three_quarters)
        five_forward_pieces8(sq, fresh, fresh_sq, xc, coef, k, sc, top, n, 1, 1);
    else if (fresh != NULL)
        five_forward_pieces8(sq, fresh, fresh_sq, xc, coef, k, sc, top, n, 1, 0);
    else if (three_quarters)
        five_forward_pieces8(sq, fresh, fresh_sq, xc, coef, k, sc, top, n, 0, 1);
    else
        five_forward_pieces8(sq, fresh, fresh_sq, xc, coef, k, sc, top, n, 0, 0);
}

/* The squares of channel c's window of five from the ring (slot d % 5 for channel d), with
 * `zeros` past the ends in front (zeros_first); the entering channel c + 2, if any, last,
 * its slot the one to fill */
static void window_of_squares(const float *ring, const float *zeros, int c, int channels,
                              int64_t n, const float *sq[5])
{
    for (int q = 0; q < 5; ++q) {
        const int d = c - 2 + q;
        sq[q] = d < 0 || d >= channels ? zeros : ring + (int64_t)(d % 5) * n;
    }
    zeros_first(sq, zeros);
}

/* The forward of one image on AVX2, window of five, beta 0.75 or 0.5 by the roots: squares
 * in a ring of five planes (slot d % 5 for channel d), channel c + 2's made in channel c's
 * pass */
AVX2 static void five_forward_image8(const float *restrict xi, float *restrict topi,
                                     float *restrict sci, float *ring, const float *zeros,
                                     int channels, int64_t n, float coef, float k,
                                     int three_quarters)
{
    for (int d = 0; d < 2 && d < channels; ++d)
        squares8(xi + (int64_t)d * n, ring + (int64_t)d * n, n);
    for (int c = 0; c < channels; ++c) {
        const float *sq[5];
        window_of_squares(ring, zeros, c, channels, n, sq);
        const int entering = c + 2 < channels;
        five_forward_squares8(sq, entering ? xi + (int64_t)(c + 2) * n : NULL,
                              ring + (int64_t)((c + 2) % 5) * n, xi + (int64_t)c * n, coef,
                              k, sci ? sci + (int64_t)c * n : NULL, topi + (int64_t)c * n, n,
                              three_quarters);
    }
}
#endif

/* top of images [0, n), and their scale when ``scale`` is not NULL (else the backward
 * remakes it from x). Returns -1 when out of memory. */
int lrn_across_forward(const float *restrict x, float *restrict top, float *restrict scale,
                       int64_t n, int channels, int64_t positions, int size, float alpha,
                       float beta, float k)
{
    const float coef = alpha / size;
    float *power = malloc(sizeof(float) * (size_t)positions);
    float *own = scale ? NULL : malloc(sizeof(float) * (size_t)positions);
    float *zeros = calloc((size_t)positions, sizeof(float));
    if (power == NULL || (scale == NULL && own == NULL) || zeros == NULL) {
        free(power);
        free(own);
        free(zeros);
        return -1;
    }
    const int lanes = roots_lanes(beta);
    (void)lanes;                        /* 0 where the compiler has no vector passes */
#if HAVE_AVX2
    if (size == 5 && lanes == 8) {
        float *ring = malloc(sizeof(float) * (size_t)(5 * positions));
        if (ring == NULL) {
            free(power);
            free(own);
            free(zeros);
            return -1;
        }
        const int64_t count = (int64_t)channels * positions;
        for (int64_t i = 0; i < n; ++i)
            five_forward_image8(x + i * count, top + i * count, scale ? scale + i * count : NULL,
                                ring, zeros, channels, positions, coef, k, beta == 0.75f);
        free(ring);
        free(power);
        free(own);
        free(zeros);
        return 0;
    }
#endif
    for (int64_t i = 0; i < n; ++i) {
        const float *xi = x + i * channels * positions;
        for (int c = 0; c < channels; ++c) {
            float *sc = scale ? scale + (i * channels + c) * positions : own;
#if HAVE_AVX512
            if (size == 5 && lanes == 16) {
                const float *w[5];
                window_of_five(xi, zeros, c, channels, positions, w);
                five_forward_roots(w, xi + (int64_t)c * positions, coef, k, scale ? sc : NULL,
                                   top + (i * channels + c) * positions, positions,
                                   beta == 0.75f);
                continue;
            }
#endif
            window_scale(xi, sc, c, channels, positions, size, coef, k, zeros);
            negative_power(sc, power, positions, beta);
            multiply(xi + (int64_t)c * positions, power, top + (i * channels + c) * positions,
                     positions);
        }
    }
    free(power);
    free(own);
    free(zeros);
    return 0;
}

/* dx of images [0, n) from the forward's top and its scale (NULL: remade from x with k).
 * Channel c needs dy * top / scale of the channels of its window: they are made a channel
 * ahead, into a ring of `size` planes that stays in cache (slot d % size), with the scale
 * where it is remade. Returns -1 when out of memory. */
int lrn_across_backward(const float *restrict x, const float *restrict top,
                        const float *restrict scale, const float *restrict dy,
                        float *restrict dx, int64_t n, int channels, int64_t positions,
                        int size, float alpha, float beta, float k)
{
    const int half = (size - 1) / 2;
    const float coef = 2.0f * alpha * beta / size;
    const int64_t count = (int64_t)channels * positions;
    const int lanes = roots_lanes(beta);
    (void)lanes;                        /* 0 where the compiler has no vector passes */
    float *scales = scale ? NULL : malloc(sizeof(float) * (size_t)(size * positions));
    float *ratio = malloc(sizeof(float) * (size_t)(size * positions));
    float *power = malloc(sizeof(float) * (size_t)positions);
    float *acc = malloc(sizeof(float) * (size_t)positions);
    float *zeros = calloc((size_t)positions, sizeof(float));
    if ((scale == NULL && scales == NULL) || ratio == NULL || power == NULL || acc == NULL ||
        zeros == NULL) {
        free(scales);
        free(ratio);
        free(power);
        free(acc);
        free(zeros);
        return -1;
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t base = i * count;
        int next = 0;                   /* the first channel whose ratio is not made yet */
        for (int c = 0; c < channels; ++c) {
            const int lo = c - half < 0 ? 0 : c - half;
            const int hi = c + half >= channels ? channels - 1 : c + half;
            for (; next <= hi; ++next) {
                const int64_t at = (int64_t)next * positions;
                float *sc = scale ? (float *)scale + base + at :
                    scales + (int64_t)(next % size) * positions;
                if (scale == NULL)
                    window_scale(x + base, sc, next, channels, positions, size, alpha / size,
                                 k, zeros);
                product_over(dy + base + at, top + base + at, sc,
                             ratio + (int64_t)(next % size) * positions, positions);
            }
            const int64_t at = (int64_t)c * positions;
            const float *sc = scale ? scale + base + at : scales + (int64_t)(c % size) * positions;
            if (size == 5) {
                const float *w[5];
                for (int q = 0; q < 5; ++q) {    /* the window's ratios in channel order */
                    int d = c - 2 + q;
                    w[q] = d < 0 || d >= channels ? zeros :
                        ratio + (int64_t)(d % size) * positions;
                }
                zeros_first(w, zeros);
#if HAVE_AVX512
                /* what the next channel's passes read from memory: the ratio's planes of
                 * channel c + 3 and its scale's, or x's entering plane c + 5 */
                const float *ahead[3] = {NULL, NULL, NULL};
                if (c + 3 < channels) {
                    const int64_t then = base + (int64_t)(c + 3) * positions;
                    ahead[0] = dy + then;
                    ahead[1] = top + then;
                    ahead[2] = scale ? scale + then : c + 5 < channels ?
                        x + base + (int64_t)(c + 5) * positions : NULL;
                }
                if (lanes == 16) {
                    five_backward_roots(w, sc, dy + base + at, x + base + at, coef,
                                        dx + base + at, positions, beta == 0.75f, ahead);
                    continue;
                }
                if (lanes == 8) {
                    five_backward_roots8(w, sc, dy + base + at, x + base + at, coef,
                                         dx + base + at, positions, beta == 0.75f, ahead);
                    continue;
                }
#endif
                five_sum(w[0], w[1], w[2], w[3], w[4], acc, positions);
            } else {
                zero(acc, positions);
                for (int d = lo; d <= hi; ++d)
                    add(acc, ratio + (int64_t)(d % size) * positions, positions);
            }
            negative_power(sc, power, positions, beta);
            backward_cells(dy + base + at, power, x + base + at, acc, coef, dx + base + at,
                           positions);
        }
    }
    free(scales);
    free(ratio);
    free(power);
    free(acc);
    free(zeros);
    return 0;
}
