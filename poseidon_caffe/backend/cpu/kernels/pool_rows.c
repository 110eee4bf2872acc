/* 2-D MAX pooling, forward, a window's rows first and then its columns, on AVX2: for CPUs
 * that have AVX2 but not AVX-512 (an AMD EPYC's), where comparing every output with all of
 * its window's taps (the phased layout; pool_lanes8.c's 8 planes a vector) is bound by the
 * comparisons: GoogLeNet's inception pools ran at 7-13% of the memory's rate, its stride-2
 * pools at 14-28%. pooling.c calls it first where the CPU has no AVX-512 (with
 * pool_lanes8_first), for column strides 1 and 2.
 *
 * The first maximum of a window in row-major order is the first, in row order, of its rows'
 * first maxima (a row taking over only when strictly greater). So each input row's windows
 * are taken once, 8 outputs a vector, each tap one load (for column stride 2, the even lanes
 * of two) from a copy of the plane padded with -inf; each output row then takes its kh rows'
 * results. A 3x3 window costs 2 + 2 comparisons, not 8. For 3-row windows of row stride 1 or
 * 2, and windows that share no rows, the outputs go down a band of rows a strip of 8 columns
 * at a time (strip_plane), the rows' results that the next output row shares kept in
 * registers: none go through memory (one thread: GoogLeNet's 28x28 inception pools 6.9-7.3 ->
 * 5.3-5.9 ms, its 56x56 stride-2 pool2 12.3 -> 10.2); with a stride of 1 two output rows
 * share their two middle rows' maximum (3 comparisons where each alone takes 2: 0.89 of the
 * time in cache). The copy of the next plane is made before this one's windows are taken, so
 * that its stores have reached the cache when the loads, straddling them, come (a load that
 * straddles stores still in flight waits for them; copying a row and reading it at once ran a
 * third slower). But the copy (a fifth of the pass with a column stride of 1, a third with 2)
 * is made only for a call's last plane, and its first where columns are padded on the left:
 * the strips read the others' rows from the input itself, a strip's taps outside the row (in
 * padding, or past its end: they would read the row before's or after's cells) made -inf by
 * a blend, tap 0's loads making the copy's NaN test, the next plane asked for a few lines at
 * each output vector (without, 1.3-1.9 times as long): GoogLeNet's, AlexNet's and VGG's
 * stride-2 pools 0.66-0.86 of the time at one thread, 0.70-0.85 at two; the inception pools
 * 0.84-0.98 and 0.89-1.05.
 *
 * Values are pooling.c's: a window's first input cell its winner until one is strictly
 * greater (-inf never is), the winner's place (row tap) * kw + column tap in a byte. A NaN
 * breaks the rows' rule (it becomes the maximum without moving the winner, and a row's
 * result cannot say where the cells before it won): a plane that holds one (the copy, or
 * the strips' loads, look) is taken window by window. Returns 0, -1 when out of memory, -2
 * where it does not serve (no AVX2, winners of 4 bytes, another column stride, rows of few
 * outputs, an empty window, pool_rows_serve off).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2.h"
#include "fetch_ahead.h"
#include "pool_window.h"

#define LANES 8
/* Rows of fewer outputs go to pool_lanes8.c: a vector mostly empty, the passes' starts cost
 * more than their work (VGG's 8x8 pool4, rows of 4: 1.9 times pool_lanes8.c's time); rows of
 * 6 gain since the strips read the input itself (AlexNet's 13x13 pool5: 0.87-0.89 of its
 * time at one thread, 0.79-1.06 at two; with the copy, 1.2 times) */
#define FEW_COLUMNS 6

/* The padded input rows a band of strips reads (three quarters of an L1 data cache of
 * 32 KB) */
#define STRIP_BAND_BYTES (24 << 10)

/* 1 (the default): this pass serves wherever it can; 0: pooling.c goes on to pool_lanes8.c
 * (the tests take both) */
int pool_rows_serve = 1;

#if HAVE_AVX2
/* Floats ahead of the row being copied that pad_plane asks the cache for: the input comes
 * from memory while the windows of a plane are taken (GoogLeNet's 28x28 stride-2 pool3 and
 * AlexNet's 27x27 pool2 0.84-0.85 of the time without, VGG's 32x32 pool2 0.76) */
#define PAD_AHEAD 1024

typedef struct {
    window2d g;
    int vectors;            /* of 8 outputs, a row: ceil(ow / 8) */
    size_t pitch;           /* floats a row of a padded plane */
    float *padded[2];       /* planes, input column c at pw + c, -inf around */
    int32_t *first;         /* per output column: its window's first column tap inside */
    float *value;           /* each input row's maxima (rows result_row apart), */
    int32_t *tap;           /* and their places u * kw + column tap */
    int32_t *places;        /* a plane's winners, and a vector of room past them */
    size_t result_row;      /* elements a row of value and tap: vectors * 8 */
    int direct;             /* by strips, from the input's own rows but a call's first and
                               last planes */
    __m256 *clip;           /* with direct, each strip's kw masks of taps outside the row, */
    int *clipped;           /* and whether a strip has any */
} rows_pass;

/* Plane x into `to`'s rows; whether it holds a NaN. The tail of a row is stored whole, -inf
 * past the row (the pitch has room), not by a masked store: AMD's take tens of cycles. */
AVX2 static int pad_plane(const rows_pass *q, const float *x, float *to)
{
    const int w = q->g.w;
    __m256 nan = _mm256_setzero_ps();
    for (int u = 0; u < q->g.h; ++u) {
        const float *src = x + (size_t)u * w;
        float *dst = to + (size_t)u * q->pitch + q->g.pw;
        for (int c = 0; c < w; c += 16)
            __builtin_prefetch(src + PAD_AHEAD + c, 0, 3);
        int c = 0;
        for (; c + LANES <= w; c += LANES) {
            const __m256 v = _mm256_loadu_ps(src + c);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            _mm256_storeu_ps(dst + c, v);
        }
        if (c < w) {
            const __m256i keep = first_lanes8(w - c);
            const __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),
                                              _mm256_maskload_ps(src + c, keep),
                                              _mm256_castsi256_ps(keep));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            _mm256_storeu_ps(dst + c, v);
        }
    }
    return _mm256_movemask_ps(nan) != 0;
}

/* Where a plane's rows are read: the padded copy, or the input's own rows, where `clip`, if not
 * NULL, holds kw masks of the lanes whose tap lies outside the row (in padding, or past the
 * row's end: -inf there, not the row before's or after's cells), and `nan`, if not NULL,
 * gathers the NaN test of the cells read (the copy made it) */
typedef struct {
    const float *rows;
    size_t pitch;           /* floats a row */
    const __m256 *clip;
    __m256 *nan;
} plane_rows;

/* Row u's first float */
static inline const float *row_at(const plane_rows *r, int u)
{
    return r->rows + (size_t)u * r->pitch;
}

/* A vector of outputs' tap t from p (their first window's first column): p[t], p[t + 1], ...
 * for a column stride of 1; for 2, p[t], p[t + 2], ..., p[t + 14] in the shuffle's order,
 * p[t] p[t + 2] p[t + 8] p[t + 10] p[t + 4] p[t + 6] p[t + 12] p[t + 14]: every vector of a
 * row's or a window's results is in that order, the same for all (q->first too), and the
 * outputs go back in theirs once, as they are stored (in_order), not at each tap's load (a
 * lane-crossing permute, 3 a row's vector). The NaN test takes tap 0's 16 cells. */
AVX2 static inline __attribute__((always_inline)) __m256
tap_vector(const float *p, int t, int sw, const __m256 *clip, __m256 *nan)
{
    __m256 v;
    if (sw == 1) {
        v = _mm256_loadu_ps(p + t);
        if (nan != NULL && t == 0)
            *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    } else {
        const __m256 low = _mm256_loadu_ps(p + t), high = _mm256_loadu_ps(p + t + LANES);
        if (nan != NULL && t == 0)
            *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(low, high, _CMP_UNORD_Q));
        v = _mm256_shuffle_ps(low, high, _MM_SHUFFLE(2, 0, 2, 0));
    }
    if (clip != NULL)
        v = _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), clip[t]);
    return v;
}

/* A vector of tap_vector's order for a column stride of 2 in the outputs' order (its middle
 * quarters swapped; the same swap is its own inverse) */
AVX2 static inline __m256 in_order(__m256 v)
{
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v),
                                                  _MM_SHUFFLE(3, 1, 2, 0)));
}

/* Output j's lane in a vector of tap_vector's order for a column stride of 2: lanes 2-3 and
 * 4-5 trade */
static inline int evens_lane(int j)
{
    const int quarter = (j & 7) >> 1;
    return (j & ~7) | ((quarter == 1 ? 2 : quarter == 2 ? 1 : quarter) << 1) | (j & 1);
}

/* An input row's windows for the 8 outputs of strip k (output columns 8k..8k+7): *best, the
 * first maximum of the row's taps in each output's window, *at its column tap (the window's
 * row adds its own place later). `first`: each output's first column tap inside (q->first's
 * strip k). Inlined with constant kw and sw. */
AVX2 static inline __attribute__((always_inline)) void
row_vector(const float *row, int k, __m256i first, int kw, int sw, const __m256 *clip,
           __m256 *nan, __m256 *best, __m256 *at)
{
    const float *p = row + (size_t)k * LANES * sw;
    /* tap 0 is the first inside, or padding (-inf) that the first inside replaces only
     * where greater: either way `first` is the winner so far */
    __m256 b = tap_vector(p, 0, sw, clip, nan);
    __m256 a = _mm256_castsi256_ps(first);
    for (int t = 1; t < kw; ++t) {
        const __m256 v = tap_vector(p, t, sw, clip, nan);
        const __m256 greater = _mm256_cmp_ps(v, b, _CMP_GT_OQ);
        b = _mm256_max_ps(v, b);                /* v where greater, else b: no NaN */
        a = _mm256_blendv_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(t)), greater);
    }
    *best = b;
    *at = a;
}

/* `at` (int32 lanes) plus `add` */
AVX2 static inline __m256 places_plus(__m256 at, int add)
{
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(at),
                                                _mm256_set1_epi32(add)));
}

/* A later row's maxima (v, their places tap) taking over where strictly greater */
AVX2 static inline __m256 take_greater(__m256 *best, __m256 at, __m256 v, __m256 tap)
{
    const __m256 greater = _mm256_cmp_ps(v, *best, _CMP_GT_OQ);
    *best = _mm256_max_ps(v, *best);
    return _mm256_blendv_ps(at, tap, greater);
}

/* Padded input row u's windows, every strip: into value and tap, the places u * kw + column
 * tap (an output row subtracts its first row's r0 * kw once). */
AVX2 static inline __attribute__((always_inline)) void
row_maxima(const rows_pass *q, const float *row, int u, float *value, int32_t *tap, int kw,
           int sw)
{
    for (int k = 0; k < q->vectors; ++k) {
        __m256 best, at;
        row_vector(row, k, _mm256_load_si256((const __m256i *)(q->first + k * LANES)), kw, sw,
                   NULL, NULL, &best, &at);
        _mm256_store_ps(value + k * LANES, best);
        _mm256_store_ps((float *)(tap + k * LANES), places_plus(at, u * kw));
    }
}

/* A vector of outputs, n of them in their row: whole where n >= 8 or with `spill` (the 8 - n
 * past the row's end land on outputs stored after it; no masked store: AMD's take tens of
 * cycles), else only the n. */
AVX2 static inline void store_outputs(float *y, __m256 best, int n, int spill)
{
    if (n >= LANES || spill) {
        _mm256_storeu_ps(y, best);
    } else {
        float values[LANES];
        _mm256_storeu_ps(values, best);
        memcpy(y, values, sizeof(float) * (size_t)n);
    }
}

/* Output row i from its input rows' results (`rows` of them from `value` and `tap`, a row
 * of the plane's results apart): each row's maxima taking over where strictly greater, into
 * y and `places` (int32: the tap's place less the window's first row's, `corner`). With
 * `spill`, a row's last vector is stored whole, past the row's end into outputs stored after
 * it (there are 8 of them at least; no masked store: AMD's take tens of cycles); `places`
 * has room for it. Inlined with constant `rows` where the window lies inside. */
AVX2 static inline __attribute__((always_inline)) void
column_maxima(const rows_pass *q, const float *value, const int32_t *tap, int rows,
              int corner, float *y, int32_t *places, int spill, int sw)
{
    const size_t apart = q->result_row;
    const int ow = q->g.ow;
    for (int k = 0; k < q->vectors; ++k) {
        __m256 best = _mm256_load_ps(value + k * LANES);
        __m256 at = _mm256_load_ps((const float *)(tap + k * LANES));
        for (int a = 1; a < rows; ++a)
            at = take_greater(&best, at, _mm256_load_ps(value + a * apart + k * LANES),
                              _mm256_load_ps((const float *)(tap + a * apart + k * LANES)));
        if (sw == 2)
            best = in_order(best), at = in_order(at);
        _mm256_storeu_si256((__m256i *)(places + k * LANES),
                            _mm256_sub_epi32(_mm256_castps_si256(at),
                                             _mm256_set1_epi32(corner)));
        store_outputs(y + k * LANES, best, ow - k * LANES, spill);
    }
}

/* Output row i's strip k from its window's rows' maxima made anew (row_vector), each taking
 * over where strictly greater: a window clipped by the plane's top or bottom, or one whose
 * rows no other output row shares. */
AVX2 static inline __attribute__((always_inline)) void
window_vector(const rows_pass *q, const plane_rows *r, int i, int k, __m256i first, int kh,
              int kw, int sw, __m256 *best, __m256 *at)
{
    const window2d *g = &q->g;
    const int r0 = i * g->sh - g->ph;
    const int lo = r0 < 0 ? 0 : r0, hi = r0 + kh > g->h ? g->h : r0 + kh;
    row_vector(row_at(r, lo), k, first, kw, sw, r->clip, r->nan, best, at);
    *at = places_plus(*at, (lo - r0) * kw);
    for (int u = lo + 1; u < hi; ++u) {
        __m256 b, a;
        row_vector(row_at(r, u), k, first, kw, sw, r->clip, r->nan, &b, &a);
        *at = take_greater(best, *at, b, places_plus(a, (u - r0) * kw));
    }
}

/* Output row i's strip k into y and `places` (a column stride of 2: from tap_vector's
 * order) */
AVX2 static inline __attribute__((always_inline)) void
put_vector(const rows_pass *q, int i, int k, __m256 best, __m256 at, float *y, int32_t *places,
           int spill, int sw)
{
    if (sw == 2)
        best = in_order(best), at = in_order(at);
    const size_t out = (size_t)i * q->g.ow + (size_t)k * LANES;
    _mm256_storeu_ps((float *)(places + out), at);
    store_outputs(y + out, best, q->g.ow - k * LANES, spill);
}

/* Output rows i and i + 1 of strip k (stride 1, 3-row windows inside the plane), from rows
 * `row` (i's first) and the three after: the two middle rows' first maximum is taken once and
 * shared, each output then comparing it with its own outer row (the earlier row keeps ties:
 * i's top, then i + 1's shared pair): 3 comparisons for two outputs where each alone takes 2.
 * *top and *middle come in as the first two rows' maxima and go out as the next pair's. */
AVX2 static inline __attribute__((always_inline)) void
output_pair(const rows_pass *q, const plane_rows *r, const float *row, int i, int k,
            __m256i first, int kw, int sw, __m256 *top, __m256 *top_at, __m256 *middle,
            __m256 *middle_at, float *y, int32_t *places, int spill)
{
    __m256 third, third_at, fourth, fourth_at;
    row_vector(row + 2 * r->pitch, k, first, kw, sw, r->clip, r->nan, &third, &third_at);
    row_vector(row + 3 * r->pitch, k, first, kw, sw, r->clip, r->nan, &fourth, &fourth_at);
    /* the middle rows' first maximum, its place from the middle row's first tap */
    __m256 pair = *middle;
    const __m256 pair_at = take_greater(&pair, *middle_at, third, places_plus(third_at, kw));
    __m256 best = *top;
    __m256 at = take_greater(&best, *top_at, pair, places_plus(pair_at, kw));
    put_vector(q, i, k, best, at, y, places, 1, sw);
    best = pair;
    at = take_greater(&best, pair_at, fourth, places_plus(fourth_at, 2 * kw));
    put_vector(q, i + 1, k, best, at, y, places, spill, sw);
    *top = third, *top_at = third_at, *middle = fourth, *middle_at = fourth_at;
}

/* Strip k of output rows [i0, i1) (a band), those of [from, to) with 3-row windows inside
 * the plane; `next`, if not NULL, asked for a few lines at each output vector. */
AVX2 static inline __attribute__((always_inline)) void
strip_down(const rows_pass *q, const plane_rows *r, int k, int i0, int i1, int from, int to,
           float *y, int32_t *places, int spill_last, fetch_ahead *next, int kh, int kw,
           int sh, int sw)
{
    const window2d *g = &q->g;
    const __m256i first = _mm256_load_si256((const __m256i *)(q->first + k * LANES));
    /* a stride of 1 and a row of padding (the inception pools): the first output row's window
     * is the next one's first two rows, the last's the one before's last two, so both take
     * those rows' maxima from the inside rows' (a 7x7 plane made 11 rows' maxima, now 7) */
    const int shares = kh == 3 && sh == 1 && g->ph == 1 && from < to;
    const int share_top = shares && from == 1 && i0 == 0;
    const int share_bottom = shares && to == g->oh - 1 && to < i1 && to + 1 == g->h;
    for (int i = i0; i < i1; ++i) {
        if (from < to && (i == from || (share_top && i == 0))) {
            const float *row = row_at(r, from * sh - g->ph);
            __m256 top, top_at, middle = _mm256_setzero_ps(), middle_at = _mm256_setzero_ps();
            row_vector(row, k, first, kw, sw, r->clip, r->nan, &top, &top_at);
            if (sh == 1)
                row_vector(row + r->pitch, k, first, kw, sw, r->clip, r->nan, &middle,
                           &middle_at);
            if (share_top && i == 0) {
                /* output 0's window: padding, then rows 0 and 1 (top and middle) */
                __m256 best = top;
                const __m256 at = take_greater(&best, places_plus(top_at, kw), middle,
                                               places_plus(middle_at, 2 * kw));
                put_vector(q, 0, k, best, at, y, places, 1, sw);
                i = 1;
            }
            if (sh == 1)
                for (; i + 1 < to; i += 2, row += 2 * r->pitch) {
                    if (next != NULL)
                        fetch_some(next);
                    output_pair(q, r, row, i, k, first, kw, sw, &top, &top_at, &middle,
                                &middle_at, y, places, i + 1 < g->oh - 1 || spill_last);
                }
            for (; i < to; ++i, row += sh * r->pitch) {
                if (next != NULL)
                    fetch_some(next);
                __m256 best = top, at = top_at, bottom, bottom_at;
                if (sh == 2)
                    row_vector(row + r->pitch, k, first, kw, sw, r->clip, r->nan, &middle,
                               &middle_at);
                at = take_greater(&best, at, middle, places_plus(middle_at, kw));
                row_vector(row + 2 * r->pitch, k, first, kw, sw, r->clip, r->nan, &bottom,
                           &bottom_at);
                at = take_greater(&best, at, bottom, places_plus(bottom_at, 2 * kw));
                put_vector(q, i, k, best, at, y, places, i < g->oh - 1 || spill_last, sw);
                if (sh == 1)
                    top = middle, top_at = middle_at, middle = bottom, middle_at = bottom_at;
                else
                    top = bottom, top_at = bottom_at;
            }
            if (share_bottom) {
                /* the last output row's window: the last two rows (top and middle), then
                 * padding */
                __m256 best = top;
                const __m256 at = take_greater(&best, top_at, middle, places_plus(middle_at, kw));
                put_vector(q, i, k, best, at, y, places, spill_last, sw);
                ++i;
            }
            if (i == i1)
                break;
        }
        if (next != NULL)
            fetch_some(next);
        __m256 best, at;
        window_vector(q, r, i, k, first, kh, kw, sw, &best, &at);
        put_vector(q, i, k, best, at, y, places, i < g->oh - 1 || spill_last, sw);
    }
}

/* A plane's outputs, strip by strip (the 8 outputs of strip k at columns 8k..8k+7), into y
 * and `places` as column_maxima's. Where 3-row windows lie inside the plane, the rows'
 * maxima the next output row shares stay in registers (a stride of 1 makes one row's a step,
 * 2 two) and none go through memory; their places are the row's own, the window's row added
 * as it takes them. The output rows go in bands whose input rows stay in the L1 cache while
 * every strip reads them down (GoogLeNet's 112x112 pool1, 53 KB a padded plane, ran 5%
 * slower by whole-plane strips than by rows through memory). In a band the strips go from
 * the last to the first, so that a last strip's store past its row's end lands on outputs of
 * the next row, stored later; `spill_last`: the plane's last row's may spill too. With a
 * stride of 1 the output rows go two at a time (output_pair). Read from the input's own rows,
 * `clips` holds each strip's kw masks (rows_pass's clip: a strip that has any blends them);
 * `nan`, `next` as plane_rows' and strip_down's. Inlined with constant kh, kw, sh and sw. */
AVX2 static inline __attribute__((always_inline)) void
strip_plane(const rows_pass *q, const float *rows, size_t pitch, const __m256 *clips,
            __m256 *nan, fetch_ahead *next, float *y, int32_t *places, int spill_last, int kh,
            int kw, int sh, int sw)
{
    const window2d *g = &q->g;
    /* output rows [inner, outer) have windows inside the plane */
    int inner = (g->ph + sh - 1) / sh;
    int outer = g->h + g->ph >= kh ? (g->h + g->ph - kh) / sh + 1 : 0;
    if (kh != 3 || (sh != 1 && sh != 2) || outer > g->oh)
        inner = outer = 0;
    const size_t band_bytes = pitch * sizeof(float) * (size_t)(sh > kh ? sh : kh);
    const int band = band_bytes < STRIP_BAND_BYTES ? (int)(STRIP_BAND_BYTES / band_bytes) : 1;
    const plane_rows whole = {rows, pitch, NULL, nan};
    for (int i0 = 0; i0 < g->oh; i0 += band) {
        const int i1 = g->oh - i0 < band ? g->oh : i0 + band;
        const int from = inner > i0 ? inner : i0, to = outer < i1 ? outer : i1;
        for (int k = q->vectors - 1; k >= 0; --k) {
            if (clips != NULL && q->clipped[k]) {
                const plane_rows clipped = {rows, pitch, clips + (size_t)k * kw, nan};
                strip_down(q, &clipped, k, i0, i1, from, to, y, places, spill_last, next, kh,
                           kw, sh, sw);
            } else {
                strip_down(q, &whole, k, i0, i1, from, to, y, places, spill_last, next, kh, kw,
                           sh, sw);
            }
        }
    }
}

/* to[c] = the low byte of from[c] (places 0..254), 32 a step: 4 vectors in 4 packs */
AVX2 static void narrow_places(const int32_t *from, uint8_t *to, int64_t n)
{
    int64_t c = 0;
    for (; c + 4 * LANES <= n; c += 4 * LANES) {
        const __m256i *f = (const __m256i *)(from + c);
        const __m256i words = _mm256_packus_epi32(_mm256_loadu_si256(f),
                                                  _mm256_loadu_si256(f + 1));
        const __m256i words2 = _mm256_packus_epi32(_mm256_loadu_si256(f + 2),
                                                   _mm256_loadu_si256(f + 3));
        /* each 128-bit half holds 4 places of each vector: put the halves' quarters back */
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words, words2),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6,
                                                                            3, 7));
        _mm256_storeu_si256((__m256i *)(to + c), bytes);
    }
    for (; c < n; ++c)
        to[c] = (uint8_t)from[c];
}

/* A plane window by window, as pooling.c's loop (for a plane that holds a NaN). */
static void max_plane_by_windows(const float *x, float *y, uint8_t *arg, const window2d *g)
{
    for (int i = 0; i < g->oh; ++i)
        for (int j = 0; j < g->ow; ++j) {
            int hs, he, ws, we;
            clip(g, i, j, &hs, &he, &ws, &we);
            const int r0 = i * g->sh - g->ph, c0 = j * g->sw - g->pw;
            float best = -INFINITY;
            int at = (hs - r0) * g->kw + ws - c0;
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v) {
                    const float value = x[(size_t)u * g->w + v];
                    if (value > best) {
                        best = value;
                        at = (u - r0) * g->kw + v - c0;
                    } else if (value != value) {
                        best = value;
                    }
                }
            y[(size_t)i * g->ow + j] = best;
            arg[(size_t)i * g->ow + j] = (uint8_t)at;
        }
}

/* Whether the windows go by strips: rows' results shared in registers (3-row windows of row
 * stride 1 or 2), or not at all (windows that share no rows) */
static inline int by_strips(int kh, int sh)
{
    return (kh == 3 && (sh == 1 || sh == 2)) || kh <= sh;
}

/* Planes [from, to) of `planes` (the call's: the outputs after a plane are stored later) from
 * the padded copy, each copied while the one before is taken; inlined with constant kh, kw,
 * sh and sw for the common windows. */
AVX2 static inline __attribute__((always_inline)) void
copied_planes(const rows_pass *q, const float *x, float *y, uint8_t *arg, int64_t from,
              int64_t to, int64_t planes, int kh, int kw, int sh, int sw)
{
    const window2d *g = &q->g;
    const int64_t cells = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    const int strips = by_strips(kh, sh);
    if (from >= to)
        return;
    int nan_next = pad_plane(q, x + from * cells, q->padded[from & 1]);
    for (int64_t p = from; p < to; ++p) {
        const float *padded = q->padded[p & 1];
        float *yp = y + p * outputs;
        uint8_t *ap = arg + p * outputs;
        const int nan = nan_next;
        if (p + 1 < to)
            nan_next = pad_plane(q, x + (p + 1) * cells, q->padded[(p + 1) & 1]);
        if (nan) {
            max_plane_by_windows(x + p * cells, yp, ap, g);
            continue;
        }
        if (strips) {
            /* the outputs after this plane (stored later), enough for a whole vector */
            strip_plane(q, padded, q->pitch, NULL, NULL, NULL, yp, q->places,
                        (planes - 1 - p) * outputs >= LANES, kh, kw, sh, sw);
            narrow_places(q->places, ap, outputs);
            continue;
        }
        for (int u = 0; u < g->h; ++u)
            row_maxima(q, padded + (size_t)u * q->pitch, u, q->value + u * q->result_row,
                       q->tap + u * q->result_row, kw, sw);
        for (int i = 0; i < g->oh; ++i) {
            const int r0 = i * sh - g->ph;
            const int a0 = r0 < 0 ? -r0 : 0, a1 = r0 + kh > g->h ? g->h - r0 : kh;
            const size_t first = (size_t)(r0 + a0) * q->result_row;
            float *yr = yp + (size_t)i * g->ow;
            int32_t *ar = q->places + (size_t)i * g->ow;
            /* the outputs after this row (stored later), enough for a whole vector */
            const int spill = (planes - 1 - p) * outputs + (int64_t)(g->oh - 1 - i) * g->ow >=
                LANES;
            if (a1 - a0 == kh)
                column_maxima(q, q->value + first, q->tap + first, kh, r0 * kw, yr, ar, spill,
                              sw);
            else
                column_maxima(q, q->value + first, q->tap + first, a1 - a0, r0 * kw, yr, ar,
                              spill, sw);
        }
        narrow_places(q->places, ap, outputs);
    }
}

/* Planes [from, to) of `planes` by strips from the input's own rows (rows_pass's direct), the
 * next plane asked for a few lines at each output vector */
AVX2 static inline __attribute__((always_inline)) void
direct_planes(const rows_pass *q, const float *x, float *y, uint8_t *arg, int64_t from,
              int64_t to, int64_t planes, int kh, int kw, int sh, int sw)
{
    const window2d *g = &q->g;
    const int64_t cells = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    for (int64_t p = from; p < to; ++p) {
        const float *xp = x + p * cells;
        float *yp = y + p * outputs;
        fetch_ahead next = fetch_region(xp + cells, cells, (int64_t)g->oh * q->vectors);
        __m256 nan = _mm256_setzero_ps();
        /* a row's tap 0 of output 0 reads its column -pw */
        strip_plane(q, xp - g->pw, (size_t)g->w, q->clip, &nan, &next, yp, q->places,
                    (planes - 1 - p) * outputs >= LANES, kh, kw, sh, sw);
        if (_mm256_movemask_ps(nan))
            max_plane_by_windows(xp, yp, arg + p * outputs, g);
        else
            narrow_places(q->places, arg + p * outputs, outputs);
    }
}

/* Every plane: a call's first (where columns are padded on the left, its first strip's loads
 * would start before the input) and last (its last strip's would pass the input's end) from
 * the copy where the others are read directly */
AVX2 static inline __attribute__((always_inline)) void
max_planes(const rows_pass *q, const float *x, float *y, uint8_t *arg, int64_t planes,
           int kh, int kw, int sh, int sw)
{
    const int64_t first = q->g.pw > 0;
    const int direct = q->direct && planes > first + 1;
    /* [0, first) copied, [first, planes - 1) read directly, the last copied; or all copied
     * (one call of each, each inlined once) */
    const int64_t bounds[4] = {0, direct ? first : planes, direct ? planes - 1 : planes, planes};
    for (int part = 0; part < 3; ++part) {
        if (part == 1)
            direct_planes(q, x, y, arg, bounds[1], bounds[2], planes, kh, kw, sh, sw);
        else
            copied_planes(q, x, y, arg, bounds[part], bounds[part + 1], planes, kh, kw, sh,
                          sw);
    }
}

AVX2 static int rows_forward(const float *x, float *y, uint8_t *arg, int64_t planes,
                             const window2d *g)
{
    const int vectors = (g->ow + LANES - 1) / LANES;
    /* a padded row holds the input row, its last vector stored whole, and every tap's load:
     * the last vector's last tap reads up to (8 vectors - 1) sw + kw - 1 + 8 (sw - 1) */
    const size_t whole = (size_t)g->pw + (size_t)(g->w + LANES - 1) / LANES * LANES;
    const size_t reach = (size_t)vectors * LANES * g->sw + g->kw;
    /* the strips read the input's own rows where tap 0's loads, 8 sw (vectors) cells a row
     * from column -pw, make the copy's NaN test, and a row's loads stay within the planes
     * before and after (a call's first and last are copied) */
    const int64_t cells = (int64_t)g->h * g->w;
    const int direct = by_strips(g->kh, g->sh) &&
        (int64_t)LANES * g->sw * vectors - g->pw >= g->w && g->pw <= cells &&
        (int64_t)reach - g->pw - g->w <= cells;
    rows_pass q = {*g, vectors, whole > reach ? whole : reach, {NULL, NULL}, NULL, NULL, NULL,
                   NULL, (size_t)vectors * LANES, direct, NULL, NULL};
    const size_t plane = q.pitch * g->h;
    q.padded[0] = _mm_malloc(sizeof(float) * plane * 2, 32);
    q.padded[1] = q.padded[0] + plane;
    q.first = _mm_malloc(sizeof(int32_t) * q.result_row, 32);
    q.value = _mm_malloc(sizeof(float) * q.result_row * g->h, 32);
    q.tap = _mm_malloc(sizeof(int32_t) * q.result_row * g->h, 32);
    q.places = _mm_malloc(sizeof(int32_t) * ((size_t)g->oh * g->ow + LANES), 32);
    if (direct) {
        q.clip = _mm_malloc(sizeof(__m256) * (size_t)vectors * g->kw, 32);
        q.clipped = calloc((size_t)vectors, sizeof(int));
    }
    int status = -1;
    if (q.padded[0] != NULL && q.first != NULL && q.value != NULL && q.tap != NULL &&
        q.places != NULL && (!direct || (q.clip != NULL && q.clipped != NULL))) {
        /* each strip's taps outside the row, for its outputs' lanes */
        for (int k = 0; direct && k < vectors; ++k)
            for (int t = 0; t < g->kw; ++t) {
                int32_t lanes[LANES];
                for (int lane = 0; lane < LANES; ++lane) {
                    const int j = k * LANES + (g->sw == 2 ? evens_lane(lane) : lane);
                    const int c = j * g->sw + t - g->pw;
                    lanes[lane] = j < g->ow && (c < 0 || c >= g->w) ? -1 : 0;
                    q.clipped[k] |= lanes[lane] != 0;
                }
                q.clip[(size_t)k * g->kw + t] =
                    _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)lanes));
            }
        for (size_t c = 0; c < plane * 2; ++c)
            q.padded[0][c] = -INFINITY;
        for (size_t j = 0; j < q.result_row; ++j) {
            const int c0 = (int)j * g->sw - g->pw;
            const int lane = g->sw == 2 ? evens_lane((int)j) : (int)j;
            q.first[lane] = c0 < 0 && (int)j < g->ow ? -c0 : 0;
        }
        if (g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1)
            max_planes(&q, x, y, arg, planes, 3, 3, 1, 1);
        else if (g->kh == 3 && g->kw == 3 && g->sh == 2 && g->sw == 2)
            max_planes(&q, x, y, arg, planes, 3, 3, 2, 2);
        else if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2)
            max_planes(&q, x, y, arg, planes, 2, 2, 2, 2);
        else if (g->sw == 1)
            max_planes(&q, x, y, arg, planes, g->kh, g->kw, g->sh, 1);
        else
            max_planes(&q, x, y, arg, planes, g->kh, g->kw, g->sh, 2);
        status = 0;
    }
    _mm_free(q.padded[0]);
    _mm_free(q.first);
    _mm_free(q.value);
    _mm_free(q.tap);
    _mm_free(q.places);
    _mm_free(q.clip);
    free(q.clipped);
    return status;
}
#endif

/* Whether every window holds an input cell: pad under the kernel, and the last window
 * starting inside the input (Caffe's geometry always; another's may not). */
static int no_empty_window(const window2d *g)
{
    return g->ph < g->kh && g->pw < g->kw && (g->oh - 1) * g->sh - g->ph < g->h &&
        (g->ow - 1) * g->sw - g->pw < g->w;
}

/* MAX: y and arg (arg_bytes 1) as pool_max_forward's. */
int pool_rows_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                          int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                          int pw)
{
    const window2d g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    if (!pool_rows_serve || !cpu_has_avx2() || arg_bytes != 1 || kh * kw > 255 ||
        (sw != 1 && sw != 2) || h < 1 || w < 1 || oh < 1 || ow < FEW_COLUMNS ||
        !no_empty_window(&g))
        return -2;
#if HAVE_AVX2
    return rows_forward(x, y, arg, planes, &g);
#else
    (void)x, (void)y, (void)arg, (void)planes;
    return -2;
#endif
}
