/* 2-D MAX pooling where 2x2 windows of stride 2 tile the plane (no padding, even sides:
 * VGG's and LeNet's poolings), on AVX2. Planes that tile lie end to end as one tall plane, so
 * both directions are one pass over rows of outputs, whatever the planes' count and size.
 *
 * Forward: 8 outputs a vector, from their windows' 16 upper and 16 lower cells: each of the
 * four taps one shuffle of two loads (the even or odd cells), the 8 outputs then in the
 * shuffle's order (two 64-bit quarters traded) until they are stored. The loads take 4
 * outputs' 8 cells each, so rows of a multiple of 4 outputs go 8 at a time wherever their
 * rows end (4 of one row and 4 of the next: LeNet's 12 a row); rows of 2 take 4 rows a vector,
 * which the same shuffles put in that same order. Values are pooling.c's: the window's cells
 * in row-major order, one taking over only when strictly greater, a NaN becoming the maximum
 * without moving the winner (place: row tap * 2 + column tap). Not served: rows of another
 * count of outputs.
 *
 * Backward: each input cell lies in one window, so dx is written once, densely, each cell the
 * window's dy where the cell is its winner and 0 elsewhere; not zeroed and then scattered
 * into a cell at a time (pooling.c's route_plane: VGG's pools at 23-47% of the memory's
 * rate). The values are Caffe's: its dx, zeroed, gets 0 + dy at the winner (0 + -0 is +0: the
 * sum is made here too, not a copy of dy). Rows of 2 outputs or of a multiple of 4 go 8
 * outputs a vector as the forward's; other rows of 8 or more, 8 of a row and the rest one at a
 * time. Not served: rows of 5 to 7 outputs, winners of 4 bytes.
 *
 * Both return 0, or -2 where they do not serve (another window or stride, padding, odd
 * sides, no AVX2). */
#include <math.h>
#include <stdint.h>

#include "avx2.h"
#include "max_tap8.h"

/* 1 (the default): the forward serves wherever it can; 0: pooling.c goes on to pool_rows.c
 * and pool_lanes8.c (the tests take each) */
int pool_tiles_serve = 1;

/* Whether 2x2 windows of stride 2 tile the planes: no padding, sides twice the output's */
static int tiles(int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    return kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && h == 2 * oh &&
        w == 2 * ow;
}

/* Rows of fewer outputs but 2 and 4 (several rows a vector) stay with the scatter: a row all
 * tail, its cells one at a time, took longer than zeroing and scattering (VGG's pool4, 8x8 ->
 * 4x4, before its rows went 4 outputs at a time: 0.5-0.8 -> 1.6-2.1 ms) */
#define FEW_OUTPUTS 8

/* Where 4 outputs of the tall plane (rows of ow outputs, ow a multiple of 4; 2 ow cells an
 * input row) find their 8 upper cells: output row r, column j, the next 4 after them */
typedef struct {
    int64_t r;
    int j;
} quad_cursor;

static inline int64_t next_quad(quad_cursor *q, int ow)
{
    const int64_t at = 2 * q->r * (2 * (int64_t)ow) + 2 * q->j;
    q->j += 4;
    if (q->j == ow) {
        q->j = 0;
        ++q->r;
    }
    return at;
}

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

/* tiles_backward 8 outputs of the tall plane at a time, rows of 2 outputs (a constant,
 * inlined) or of a multiple of 4: each 4 outputs' 8 upper and 8 lower cells at their place
 * (rows of 4, 12, ...: no row's last outputs one at a time), or rows of 2 four rows a vector,
 * their input rows 32 cells end to end, the unpacks' halves landing a row apart. Outputs past
 * the last whole 8 one at a time. */
AVX2 static inline __attribute__((always_inline)) void
tiles_backward_quads(const float *dy, const uint8_t *arg, float *dx, int64_t count, int ow)
{
    const int64_t w = 2 * (int64_t)ow;
    const __m256 zero = _mm256_setzero_ps();
    quad_cursor q = {0, 0};
    int64_t o = 0;
    for (; o + 8 <= count; o += 8) {
        const __m256 g = _mm256_add_ps(zero, _mm256_loadu_ps(dy + o));
        const __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(arg + o)));
        __m256 cells[4];        /* upper outputs 0-3, 4-7; lower 0-3, 4-7: 8 cells each */
        for (int half = 0; half < 2; ++half) {
            const __m256 even = _mm256_and_ps(
                _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, _mm256_set1_epi32(2 * half))), g);
            const __m256 odd = _mm256_and_ps(
                _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, _mm256_set1_epi32(2 * half + 1))),
                g);
            const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
            cells[2 * half] = _mm256_permute2f128_ps(lo, hi, 0x20);
            cells[2 * half + 1] = _mm256_permute2f128_ps(lo, hi, 0x31);
        }
        for (int part = 0; part < 2; ++part) {      /* outputs 0-3, then 4-7 */
            const __m256 upper = cells[part], lower = cells[2 + part];
            if (ow == 2) {          /* two output rows, each a half: rows 2r .. 2r + 3 */
                float *to = dx + 2 * o * 2 + 16 * part;
                _mm256_storeu_ps(to, _mm256_permute2f128_ps(upper, lower, 0x20));
                _mm256_storeu_ps(to + 8, _mm256_permute2f128_ps(upper, lower, 0x31));
            } else {                /* 4 outputs of a row: input rows 2r and 2r + 1 */
                float *to = dx + next_quad(&q, ow);
                _mm256_storeu_ps(to, upper);
                _mm256_storeu_ps(to + w, lower);
            }
        }
    }
    for (; o < count; ++o) {
        float *upper = dx + 2 * (o / ow) * w + 2 * (o % ow), *lower = upper + w;
        for (int t = 0; t < 4; ++t)
            (t < 2 ? upper : lower)[t & 1] = arg[o] == t ? 0.0f + dy[o] : 0.0f;
    }
}

/* tiles_backward_quads with rows of 2 outputs, of 4, or of another multiple of 4 */
AVX2 static void tiles_backward_by_quads(const float *dy, const uint8_t *arg, float *dx,
                                         int64_t count, int ow)
{
    if (ow == 2)
        tiles_backward_quads(dy, arg, dx, count, 2);
    else if (ow == 4)           /* a constant: each 4 outputs a row of their own */
        tiles_backward_quads(dy, arg, dx, count, 4);
    else
        tiles_backward_quads(dy, arg, dx, count, ow);
}
#endif

int pool_tiles_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                            int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                            int sh, int sw, int ph, int pw)
{
    const int quads = ow == 2 || ow % 4 == 0;
    if (!cpu_has_avx2() || arg_bytes != 1 || !tiles(h, w, oh, ow, kh, kw, sh, sw, ph, pw) ||
        (ow < FEW_OUTPUTS && !quads))
        return -2;
#if HAVE_AVX2
    if (quads)
        tiles_backward_by_quads(dy, arg, dx, planes * oh * ow, ow);
    else
        tiles_backward(dy, arg, dx, planes * oh, ow);
    return 0;
#else
    (void)dy, (void)arg, (void)dx, (void)planes;
    return -2;
#endif
}

#if HAVE_AVX2
/* The 8 outputs from flat output o of the tall plane (rows of ow outputs, 2 ow cells an input
 * row): the loads of their upper cells (a: outputs 0-3's, b: 4-7's, in the shuffle's order)
 * and lower ones (c, d). Inlined: ow 2 a constant, else a multiple of 4 (`q` at o). */
AVX2 static inline __attribute__((always_inline)) void
tile_loads8(const float *x, int64_t o, int ow, quad_cursor *q, __m256 *a, __m256 *b,
            __m256 *c, __m256 *d)
{
    const int64_t w = 2 * (int64_t)ow;
    if (ow == 2) {          /* input rows of 4: rows 2r .. 2r + 7 are 32 cells in a row */
        const float *at = x + 2 * o * 2;
        const __m256 v0 = _mm256_loadu_ps(at), v1 = _mm256_loadu_ps(at + 8);
        const __m256 v2 = _mm256_loadu_ps(at + 16), v3 = _mm256_loadu_ps(at + 24);
        *a = _mm256_permute2f128_ps(v0, v1, 0x20);
        *c = _mm256_permute2f128_ps(v0, v1, 0x31);
        *b = _mm256_permute2f128_ps(v2, v3, 0x20);
        *d = _mm256_permute2f128_ps(v2, v3, 0x31);
    } else {                /* 4 outputs of a row, then 4 of the same row or the next */
        const float *first = x + next_quad(q, ow), *then = x + next_quad(q, ow);
        *a = _mm256_loadu_ps(first);
        *c = _mm256_loadu_ps(first + w);
        *b = _mm256_loadu_ps(then);
        *d = _mm256_loadu_ps(then + w);
    }
}

/* Outputs [0, count - count % 8) of the tall plane, 8 at a time */
AVX2 static inline __attribute__((always_inline)) void
tiles_forward8(const float *x, float *y, void *arg, int arg_bytes, int64_t count, int ow)
{
    quad_cursor q = {0, 0};
    for (int64_t o = 0; o + 8 <= count; o += 8) {
        __m256 a, b, c, d;
        tile_loads8(x, o, ow, &q, &a, &b, &c, &d);
        /* lanes (0, 1, 4, 5 | 2, 3, 6, 7) of the 8 outputs: tap 0, the upper even cells */
        __m256 best = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 won = _mm256_setzero_ps();
        const __m256 upper_odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        const __m256 lower_even = _mm256_shuffle_ps(c, d, _MM_SHUFFLE(2, 0, 2, 0));
        const __m256 lower_odd = _mm256_shuffle_ps(c, d, _MM_SHUFFLE(3, 1, 3, 1));
        MAX_TAP8(best, won, upper_odd, place(1));
        MAX_TAP8(best, won, lower_even, place(2));
        MAX_TAP8(best, won, lower_odd, place(3));
        /* the outputs' order: the middle 64-bit quarters traded */
        _mm256_storeu_ps(y + o, _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(best), _MM_SHUFFLE(3, 1, 2, 0))));
        const __m256i places = _mm256_permute4x64_epi64(_mm256_castps_si256(won),
                                                        _MM_SHUFFLE(3, 1, 2, 0));
        if (arg_bytes == 1) {
            const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(places),
                                                    _mm256_extracti128_si256(places, 1));
            _mm_storel_epi64((__m128i *)((uint8_t *)arg + o), _mm_packus_epi16(halves, halves));
        } else {
            _mm256_storeu_si256((__m256i *)((int32_t *)arg + o), places);
        }
    }
}

/* tiles_forward8 with rows of 2 outputs, of 4, or of another multiple of 4 */
AVX2 static void tiles_forward(const float *x, float *y, void *arg, int arg_bytes,
                               int64_t count, int ow)
{
    if (ow == 2)
        tiles_forward8(x, y, arg, arg_bytes, count, 2);
    else if (ow == 4)           /* a constant: each 4 outputs a row of their own */
        tiles_forward8(x, y, arg, arg_bytes, count, 4);
    else
        tiles_forward8(x, y, arg, arg_bytes, count, ow);
}
#endif

/* One output of the tall plane, as a lane of tiles_forward8 */
static void tile_forward1(const float *x, float *y, void *arg, int arg_bytes, int64_t o,
                          int ow)
{
    const int64_t w = 2 * (int64_t)ow;
    const float *at = x + 2 * (o / ow) * w + 2 * (o % ow);
    const float cells[4] = {at[0], at[1], at[w], at[w + 1]};
    float best = cells[0];
    int won = 0;
    for (int t = 1; t < 4; ++t) {
        if (cells[t] > best)
            won = t;
        if (cells[t] > best || isnan(cells[t]))
            best = cells[t];
    }
    y[o] = best;
    if (arg_bytes == 1)
        ((uint8_t *)arg)[o] = (uint8_t)won;
    else
        ((int32_t *)arg)[o] = won;
}

int pool_tiles_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                           int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                           int ph, int pw)
{
    if (!pool_tiles_serve || !cpu_has_avx2() || !tiles(h, w, oh, ow, kh, kw, sh, sw, ph, pw) ||
        (arg_bytes != 1 && arg_bytes != 4) || !(ow == 2 || ow % 4 == 0))
        return -2;
#if HAVE_AVX2
    const int64_t count = planes * oh * ow;
    tiles_forward(x, y, arg, arg_bytes, count, ow);
    for (int64_t o = count - count % 8; o < count; ++o)
        tile_forward1(x, y, arg, arg_bytes, o, ow);
    return 0;
#else
    (void)x, (void)y, (void)arg, (void)planes;
    return -2;
#endif
}
