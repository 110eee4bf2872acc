/* 2-D MAX pooling of stride 1 whose output is its input's size (GoogLeNet's 3x3 pad 1
 * inception poolings), forward and backward, on AVX-512, and the backward on AVX2 too
 * (pooling.c calls these first).
 *
 * Every tap of such a window is the same shift of the flat index in every plane: output cell
 * f reads input cell f + (a - ph) * w + (t - pw) for tap (a, t). So 16 consecutive cells of
 * the batch's planes, wherever a row or a plane ends among them, are one vector, and a tap is
 * one shifted load masked by which of the 16 windows hold it (from a table of the places 16
 * cells can start in a plane). No layout copy and no transpose: each pass reads and writes
 * memory once (pool_lanes.c's 16 planes a vector spent over half its time on the transposes
 * in and out).
 *
 * 3x3 windows (padding 1) go a window's rows first where the CPU has AVX-512's byte lanes
 * (same_max3_forward below): 4 comparisons an output, not 9 and 9 NaN tests.
 *
 * Values are pooling.c's: the window's cells in row-major order, one taking over only when
 * strictly greater, a NaN becoming the maximum without moving the winner, the winner's place
 * (row tap * kw + column tap) kept in a byte. Backward gathers instead of scattering: cell f
 * sums dy of each output whose winner it is, in the outputs' order (as pooling.c's scatter
 * adds them), so the sums are the same bit for bit. Each returns 0, or -2 where it does not
 * serve (no AVX-512, or for the backward no AVX2; a window of more than 255 cells; a table
 * past MAX_TABLE; no memory).
 *
 * The AVX2 backward (CPUs without AVX-512: an AMD EPYC's) needs no table: a winner's place
 * names a cell inside its window (padding never wins), so output o = f - shift of tap (a, t)
 * whose place is a * kw + t has its winner at f exactly, whatever rows or planes lie between,
 * and every other o's place differs. 8 cells a vector, each tap's 8 places one 8-byte load
 * (GoogLeNet's 28x28 inception pools' backward 7.9 -> 3.8 ms at one thread: the scatter's
 * load and store a window, waiting on each other where windows share a winner, took 1.2 ns a
 * cell).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2.h"
#include "max_rows3.h"

#define LANES 16
#define LANES8 8         /* the AVX2 backward's */

#if HAVE_AVX512
/* Which of 16 consecutive cells' windows hold each tap, for every place the 16 can start in a
 * plane (cell 16 k, k = 0, 1, ...: the starts repeat after plane / gcd(plane, 16) of them):
 * masks[k * taps + a * kw + t], bit l for cell 16 k + l; then, from masks + starts * taps,
 * each cell's first tap inside the input (LANES bytes a start). NULL when out of memory or
 * larger than MAX_TABLE. */
#define MAX_TABLE (1 << 18)
static uint16_t *tap_masks(int h, int w, int kh, int kw, int ph, int pw, int *starts)
{
    int64_t plane = (int64_t)h * w, g = LANES;
    for (int64_t r = plane % g; r;) {        /* gcd(plane, 16) */
        int64_t next = g % r;
        g = r;
        r = next;
    }
    int64_t count = plane / g, taps = (int64_t)kh * kw;
    size_t bytes = (size_t)(count * taps) * sizeof(uint16_t) + (size_t)(count * LANES);
    if (bytes > MAX_TABLE)
        return NULL;
    uint16_t *masks = calloc(bytes, 1);
    if (masks == NULL)
        return NULL;
    uint8_t *firsts = (uint8_t *)(masks + count * taps);
    for (int64_t k = 0; k < count; ++k)
        for (int l = 0; l < LANES; ++l) {
            int64_t q = (k * LANES + l) % plane;
            int i = (int)(q / w), j = (int)(q % w), first = -1;
            for (int a = 0; a < kh; ++a)
                for (int t = 0; t < kw; ++t)
                    if (i + a - ph >= 0 && i + a - ph < h && j + t - pw >= 0 &&
                        j + t - pw < w) {
                        masks[k * taps + a * kw + t] |= (uint16_t)(1u << l);
                        first = first < 0 ? a * kw + t : first;
                    }
            firsts[k * LANES + l] = (uint8_t)first;     /* the window's centre at least */
        }
    *starts = (int)count;
    return masks;
}

/* Inlined with constant kh and kw (3x3), so the taps unroll and their masks stay in
 * registers. */
AVX512 static inline __attribute__((always_inline)) void
same_max_forward(const float *x, float *y, uint8_t *arg, int64_t cells, const uint16_t *masks,
                 const uint8_t *firsts, int starts, int w, int kh, int kw, int ph, int pw)
{
    int start = 0;
    for (int64_t f = 0; f < cells; f += LANES) {
        __mmask16 lanes = first_lanes(cells - f);
        const uint16_t *m = masks + (size_t)start * kh * kw;
        __m512 best = _mm512_set1_ps(-__builtin_inff());
        /* each window's first cell is its winner until a greater one comes */
        __m512i at = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(
            firsts + (size_t)start * LANES)));
#pragma GCC unroll 16
        for (int a = 0; a < kh; ++a)
#pragma GCC unroll 16
            for (int t = 0; t < kw; ++t) {
                __mmask16 valid = m[a * kw + t] & lanes;
                __m512 value = _mm512_maskz_loadu_ps(valid, x + f + (a - ph) * w + (t - pw));
                __mmask16 greater = _mm512_mask_cmp_ps_mask(valid, value, best, _CMP_GT_OQ);
                __mmask16 nan = _mm512_mask_cmp_ps_mask(valid, value, value, _CMP_UNORD_Q);
                best = _mm512_mask_mov_ps(best, greater | nan, value);
                at = _mm512_mask_mov_epi32(at, greater, _mm512_set1_epi32(a * kw + t));
            }
        _mm512_mask_storeu_ps(y + f, lanes, best);
        _mm512_mask_cvtepi32_storeu_epi8(arg + f, lanes, at);
        if (++start == starts)
            start = 0;
    }
}

/* 3x3 windows padded by 1 (the inception pools) a window's rows first: row results R[f],
 * the first maximum of cells f - 1, f, f + 1 inside the row and its column tap, are made once
 * and each output takes R[f - w], R[f], R[f + w] (a later row only where strictly greater):
 * 2 + 2 comparisons a cell, not 9 and 9 NaN tests (on a Xeon, 28x28 planes in the L2 cache:
 * 0.52 of the taps' time). The first maximum in row-major order is the first, in row order,
 * of the rows' first maxima; a window's first cell inside, its winner while no cell is
 * greater, is its first row's first inside (every row has the same columns inside).
 * The batch goes in chunks whose rows' results (and the rows before and after, made again)
 * stay in the L1 cache. A NaN breaks the rows' rule (it becomes the maximum without moving
 * the winner, and a row's result cannot say where cells before it won): a batch that holds
 * one is taken again by the taps. */
#define ROWS_CHUNK 2048           /* cells a chunk: 10 KB of rows' results */
/* Cells ahead of the rows' and the outputs' vectors whose x and y lines are asked for (y's
 * for writing: a store that misses waits for its line): 28x28 planes out of cache 0.63 of the
 * time with both, 0.68 with y's alone */
#define FETCH_AHEAD 1024

/* Row results of cells f..f + 15 (`lanes` of them) into value and column; m: their taps'
 * masks (tap_masks'). */
AVX512BW static inline __attribute__((always_inline)) void
row_results(const float *x, int64_t f, __mmask16 lanes, const uint16_t *m, float *value,
            uint8_t *column, __mmask16 *nan)
{
    const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
    const __mmask16 left = m[3] & lanes;                  /* taps (1, 0) and (1, 2) */
    const __m512 l = _mm512_mask_loadu_ps(minus_inf, left, x + f - 1);
    const __m512 c = lanes == 0xFFFF ? _mm512_loadu_ps(x + f) :
        _mm512_maskz_loadu_ps(lanes, x + f);
    const __m512 r = _mm512_mask_loadu_ps(minus_inf, m[5] & lanes, x + f + 1);
    *nan |= _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
    const __m128i none = _mm_setzero_si128();
    __m128i at;
    _mm512_store_ps(value, first_of_three(l, c, r, none, none, none, (__mmask16)~left, 1, &at));
    _mm_store_si128((__m128i *)column, at);
}

/* Outputs f..f + 15 (`lanes` of them) from the row results around v and t (cell f's) */
AVX512BW static inline __attribute__((always_inline)) void
column_results(const float *v, const uint8_t *t, int64_t w, __mmask16 lanes,
               const uint16_t *m, float *y, uint8_t *arg)
{
    const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
    const __mmask16 above = m[1];                         /* taps (0, 1) and (2, 1) */
    const __m512 top = _mm512_mask_loadu_ps(minus_inf, above, v - w);
    const __m512 middle = _mm512_loadu_ps(v);
    const __m512 bottom = _mm512_mask_loadu_ps(minus_inf, m[7], v + w);
    __m128i at;
    const __m512 best = first_of_three(top, middle, bottom,
                                       _mm_loadu_si128((const __m128i *)(t - w)),
                                       _mm_loadu_si128((const __m128i *)t),
                                       _mm_loadu_si128((const __m128i *)(t + w)),
                                       (__mmask16)~above, 3, &at);
    if (lanes == 0xFFFF) {
        _mm512_storeu_ps(y, best);
        _mm_storeu_si128((__m128i *)arg, at);
    } else {
        _mm512_mask_storeu_ps(y, lanes, best);
        _mm_mask_storeu_epi8(arg, lanes, at);
    }
}

/* The batch's 3x3 windows by rows (above) into y and arg: 0, or 1 where the taps must take
 * it instead (it holds a NaN; no memory). */
AVX512BW static int same_max3_forward(const float *x, float *y, uint8_t *arg, int64_t planes,
                                      int h, int w)
{
    const int64_t cells = planes * h * w;
    const int64_t reach = (int64_t)(w + LANES - 1) / LANES * LANES;  /* a row, in vectors */
    const int64_t chunk = 8 * reach > ROWS_CHUNK ? 8 * reach : ROWS_CHUNK;
    const size_t room = (size_t)(chunk + 2 * reach + LANES);
    int starts = 1;
    uint16_t *masks = tap_masks(h, w, 3, 3, 1, 1, &starts);
    float *value = _mm_malloc(sizeof(float) * room, 64);
    uint8_t *column = _mm_malloc(room, 64);
    int nan = masks == NULL || value == NULL || column == NULL;
    if (!nan) {
        /* the lanes of row results past the batch's ends (zeros, or an earlier chunk's) are
         * read only where masked off or never stored */
        memset(value, 0, sizeof(float) * room);
        memset(column, 0, room);
    }
    const uint16_t *const table_end = masks + (size_t)starts * 9;
    __mmask16 nans = 0;
    for (int64_t c0 = 0; c0 < cells && !nan; c0 += chunk) {
        const int64_t c1 = cells - c0 < chunk ? cells : c0 + chunk;
        const int64_t base = c0 - reach;                  /* value[0]'s cell */
        const int64_t r0 = base < 0 ? 0 : base;
        const int64_t r1 = c1 + reach < cells ? c1 + reach : cells;
        const uint16_t *m = masks + (size_t)(r0 / LANES % starts) * 9;
        for (int64_t f = r0; f < r1; f += LANES) {
            __builtin_prefetch(x + f + FETCH_AHEAD, 0, 3);
            if (f + LANES <= cells)
                row_results(x, f, 0xFFFF, m, value + (f - base), column + (f - base), &nans);
            else
                row_results(x, f, first_lanes(cells - f), m, value + (f - base),
                            column + (f - base), &nans);
            if ((m += 9) == table_end)
                m = masks;
        }
        m = masks + (size_t)(c0 / LANES % starts) * 9;
        for (int64_t f = c0; f < c1; f += LANES) {
            __builtin_prefetch(y + f + FETCH_AHEAD, 1, 3);     /* for writing */
            if (f + LANES <= cells)
                column_results(value + (f - base), column + (f - base), w, 0xFFFF, m, y + f,
                               arg + f);
            else
                column_results(value + (f - base), column + (f - base), w,
                               first_lanes(cells - f), m, y + f, arg + f);
            if ((m += 9) == table_end)
                m = masks;
        }
        nan = nans != 0;
    }
    free(masks);
    _mm_free(value);
    _mm_free(column);
    return nan;
}

/* dx[f] = sum of dy[o] over the outputs o whose window's winner is cell f: o = f - shift of
 * tap (a, t), for the taps from the last to the first (the outputs in increasing order). Tap
 * (a, t)'s output holds f where tap (kh - 1 - a, kw - 1 - t)'s window of f holds o (the
 * windows are centred: 2 ph = kh - 1). */
static float gathered_cell(const float *dy, const uint8_t *arg, int64_t f, __mmask16 lane,
                           const uint16_t *m, int w, int kh, int kw, int ph, int pw)
{
    float sum = 0.0f;
    for (int a = kh - 1; a >= 0; --a)
        for (int t = kw - 1; t >= 0; --t) {
            int64_t o = f + (int64_t)(ph - a) * w + (pw - t);
            if ((m[(kh - 1 - a) * kw + kw - 1 - t] & lane) && arg[o] == a * kw + t)
                sum += dy[o];
        }
    return sum;
}

AVX512 static inline __attribute__((always_inline)) void
same_max_backward(const float *dy, const uint8_t *arg, float *dx, int64_t cells,
                  const uint16_t *masks, int starts, int w, int kh, int kw, int ph, int pw)
{
    int64_t reach = (int64_t)(kh - 1 - ph) * w + (kw - 1 - pw);   /* the farthest output */
    int64_t back = (int64_t)ph * w + pw;
    int start = 0;
    for (int64_t f = 0; f < cells; f += LANES) {
        const uint16_t *m = masks + (size_t)start * kh * kw;
        if (++start == starts)
            start = 0;
        if (f < reach || f + LANES + back > cells) {
            /* near the batch's ends, where 16 winners' bytes would be read past it */
            for (int l = 0; l < LANES && f + l < cells; ++l)
                dx[f + l] = gathered_cell(dy, arg, f + l, (__mmask16)(1u << l), m, w, kh, kw,
                                          ph, pw);
            continue;
        }
        __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int a = kh - 1; a >= 0; --a)
#pragma GCC unroll 16
            for (int t = kw - 1; t >= 0; --t) {
                int64_t o = f + (int64_t)(ph - a) * w + (pw - t);
                __m512i won = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(arg + o)));
                __mmask16 mine = _mm512_mask_cmpeq_epi32_mask(
                    m[(kh - 1 - a) * kw + kw - 1 - t], won, _mm512_set1_epi32(a * kw + t));
                sum = _mm512_mask_add_ps(sum, mine, sum, _mm512_maskz_loadu_ps(mine, dy + o));
            }
        _mm512_storeu_ps(dx + f, sum);
    }
}

AVX512 static int same_max(const float *in, const void *arg_in, float *out, void *arg_out,
                           int64_t planes, int h, int w, int kh, int kw, int ph, int pw)
{
    if (arg_out != NULL && kh == 3 && kw == 3 && cpu_has_avx512bw() &&
        same_max3_forward(in, out, arg_out, planes, h, w) == 0)
        return 0;
    int starts;
    uint16_t *masks = tap_masks(h, w, kh, kw, ph, pw, &starts);
    if (masks == NULL)
        return -2;
    int64_t cells = planes * h * w;
    const uint8_t *firsts = (const uint8_t *)(masks + (size_t)starts * kh * kw);
    if (arg_out != NULL) {
        if (kh == 3 && kw == 3)
            same_max_forward(in, out, arg_out, cells, masks, firsts, starts, w, 3, 3, 1, 1);
        else
            same_max_forward(in, out, arg_out, cells, masks, firsts, starts, w, kh, kw, ph,
                             pw);
    } else {
        if (kh == 3 && kw == 3)
            same_max_backward(in, arg_in, out, cells, masks, starts, w, 3, 3, 1, 1);
        else
            same_max_backward(in, arg_in, out, cells, masks, starts, w, kh, kw, ph, pw);
    }
    free(masks);
    return 0;
}
#endif

/* pool_lanes8.c's: whether the AVX2 passes come first (no AVX-512, or asked to) */
int pool_lanes8_first(void);

#if HAVE_AVX2
/* dx[f] for cells f of [from, to), one at a time: the vectors' sums where 8 winners' bytes
 * would be read past the batch */
static void gathered_cells(const float *dy, const uint8_t *arg, float *dx, int64_t from,
                           int64_t to, int64_t cells, int w, int kh, int kw, int ph, int pw)
{
    for (int64_t f = from; f < to; ++f) {
        float sum = 0.0f;
        for (int a = kh - 1; a >= 0; --a)
            for (int t = kw - 1; t >= 0; --t) {
                const int64_t o = f + (int64_t)(ph - a) * w + (pw - t);
                if (o >= 0 && o < cells && arg[o] == a * kw + t)
                    sum += dy[o];
            }
        dx[f] = sum;
    }
}

/* The backward on AVX2, 8 cells a vector: each tap's outputs whose place is the tap add
 * their dy, the others 0 (a sum from 0 is never -0, so adding 0 changes none), taps from the
 * last to the first (the outputs in increasing order). Inlined with constant kh and kw. */
AVX2 static inline __attribute__((always_inline)) void
same_max_backward8(const float *dy, const uint8_t *arg, float *dx, int64_t cells, int w,
                   int kh, int kw, int ph, int pw)
{
    const int64_t reach = (int64_t)(kh - 1 - ph) * w + (kw - 1 - pw);  /* the first output */
    const int64_t back = (int64_t)ph * w + pw;                         /* the last */
    const int64_t from = reach < cells ? reach : cells;
    int64_t f = from;
    gathered_cells(dy, arg, dx, 0, from, cells, w, kh, kw, ph, pw);
    for (; f + LANES8 + back <= cells; f += LANES8) {
        __m256 sum = _mm256_setzero_ps();
#pragma GCC unroll 16
        for (int a = kh - 1; a >= 0; --a)
#pragma GCC unroll 16
            for (int t = kw - 1; t >= 0; --t) {
                const int64_t o = f + (int64_t)(ph - a) * w + (pw - t);
                const __m256i won = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(arg + o)));
                const __m256 mine = _mm256_castsi256_ps(
                    _mm256_cmpeq_epi32(won, _mm256_set1_epi32(a * kw + t)));
                sum = _mm256_add_ps(sum, _mm256_and_ps(mine, _mm256_loadu_ps(dy + o)));
            }
        _mm256_storeu_ps(dx + f, sum);
    }
    gathered_cells(dy, arg, dx, f, cells, cells, w, kh, kw, ph, pw);
}

AVX2 static void same_max8(const float *dy, const uint8_t *arg, float *dx, int64_t cells, int w,
                           int kh, int kw, int ph, int pw)
{
    if (kh == 3 && kw == 3)
        same_max_backward8(dy, arg, dx, cells, w, 3, 3, 1, 1);
    else
        same_max_backward8(dy, arg, dx, cells, w, kh, kw, ph, pw);
}
#endif

static int serves(int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                  int pw, int arg_bytes)
{
    return arg_bytes == 1 && sh == 1 && sw == 1 && oh == h && ow == w && kh * kw <= 255 &&
        ph < kh && pw < kw;
}

int pool_same_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                          int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                          int ph, int pw)
{
    if (!HAVE_AVX512 || !cpu_has_avx512() || !serves(h, w, oh, ow, kh, kw, sh, sw, ph, pw,
                                                     arg_bytes))
        return -2;
#if HAVE_AVX512
    return same_max(x, NULL, y, arg, planes, h, w, kh, kw, ph, pw);
#endif
    return -2;
}

int pool_same_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                           int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                           int sh, int sw, int ph, int pw)
{
    if (!serves(h, w, oh, ow, kh, kw, sh, sw, ph, pw, arg_bytes))
        return -2;
#if HAVE_AVX2
    if (pool_lanes8_first()) {
        same_max8(dy, arg, dx, planes * h * w, w, kh, kw, ph, pw);
        return 0;
    }
#endif
#if HAVE_AVX512
    if (cpu_has_avx512())
        return same_max(dy, arg, dx, NULL, planes, h, w, kh, kw, ph, pw);
#endif
    return -2;
}
