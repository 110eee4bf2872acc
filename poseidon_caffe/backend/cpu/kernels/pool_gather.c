/* MAX and AVE pooling's backward where 3x3 windows step by 2 on both axes (AlexNet's,
 * GoogLeNet's and CIFAR-10 quick's poolings), on AVX2, as a gather: each input cell sums the
 * dy of the windows whose winner it is (MAX) or the shares of the windows that hold it (AVE),
 * and dx is written once, two rows at a time, never zeroed first.
 *
 * In padded coordinates (row v = input row + ph, column u = input column + pw) window (k, l)
 * covers rows 2k..2k + 2 and columns 2l..2l + 2, so cell (v, u) lies in at most two window
 * rows and two window columns, each at a fixed tap: an even row 2k is tap row 2 of window row
 * k - 1 and tap row 0 of k, an odd row 2k + 1 tap row 1 of k; columns alike. A winner's place
 * (row tap * 3 + column tap, 255 for none) names its cell, so the cell's sum takes the dy of
 * each such window whose place is that tap: a comparison with a constant. Windows l..l + 7
 * and l - 1..l + 6 of rows k - 1 and k (8 winners' bytes widened to int32 by one load) give
 * the 16 cells of columns 2l..2l + 15 of rows 2k and 2k + 1, interleaved by two unpacks and
 * two permutes. In cache MAX takes 2.1-3.4 cycles an output on an AMD Zen 3 where pooling.c's
 * scatter takes about 4 (a store waiting on the load before it where windows share a winner,
 * and dx zeroed first); out of cache, at a batch's size, 0.65-0.8 of the scatter's time. AVE
 * adds every window's share (dy / Caffe's divisor), each plane's made a plane ahead into rows
 * bordered by 0: CIFAR-10 quick's pool2 0.8 of pool_ave_vectors.c's time (in cache 0.5).
 *
 * The sums are Caffe's bit for bit: a cell's terms are added from 0 in the outputs' order
 * (window row k - 1 before k, column l - 1 before l), a window that did not choose the cell,
 * or that does not exist, adding +0, which changes no sum from 0 (never -0). MAX reads the
 * windows where they lie: window -1 is a shift of the first 8, windows past the row's ow are
 * made -1 (no tap), rows of windows outside the output read a row of no winners, and the
 * rows whose loads would pass the arrays' ends are copied first. Return 0, or -2 where they
 * do not serve (no AVX2, another window or stride, MAX's winners of 4 bytes, padding of 3 or
 * more, rows of fewer than 16 cells) or are out of memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2.h"

#define NO_WINNER 255
#define LANES8 8

/* Rows of fewer than 16 cells (AlexNet's 13x13 pool5, GoogLeNet's 14x14 pool4, CIFAR-10
 * quick's 8x8 pool3) stay with pooling.c's passes: one block a row, partly empty, with its
 * edges taken care of, ran 1.2-2.1 times slower. */
static int serves(int w, int kh, int kw, int sh, int sw, int ph, int pw)
{
    return cpu_has_avx2() && kh == 3 && kw == 3 && sh == 2 && sw == 2 && ph < 3 && pw < 3 &&
        w >= 2 * LANES8;
}

#if HAVE_AVX2
/* A row of windows: their winners' places and their dy, readable for `reach` entries */
typedef struct {
    const uint8_t *place;
    const float *grad;
} window_row;

/* What a block of 8 pairs of columns must take care of (or-ed, a constant where inlined):
 * the first block's window -1, a shift of its windows (a row is never read before its start);
 * an edge block's windows past the row's ow (made -1, no tap) and cells outside the row of dx
 * (its stores clipped); the last block, which ends at the row's last pair (overlapping the
 * block before: its cells are stored twice, the same), its windows past ow made -1 too, and
 * with OVER, its last cell one past the row (the row's last 8 cells stored from both
 * halves) */
#define FIRST 1
#define EDGE 2
#define LAST 4
#define OVER 8

/* Windows m..m + 7 of a row (cur) and m - 1..m + 6 (prev): MAX's places as int32 and their
 * dy, or AVE's shares alone (rows of shares bordered by 0: no care) */
AVX2 static inline __attribute__((always_inline)) void
windows8(window_row r, int m, int ow, int care, int ave, __m256i *cur, __m256 *gcur,
         __m256i *prev, __m256 *gprev)
{
    if (ave) {
        *gcur = _mm256_loadu_ps(r.grad + m);
        *gprev = _mm256_loadu_ps(r.grad + m - 1);
        *cur = *prev = _mm256_setzero_si256();
        return;
    }
    const __m256i none = _mm256_set1_epi32(-1);
    *cur = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r.place + m)));
    *gcur = _mm256_loadu_ps(r.grad + m);
    if (care & FIRST) {
        const __m256i up = _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6);
        *prev = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(*cur, up), none, 1);
        *gprev = _mm256_permutevar8x32_ps(*gcur, up);
    } else {
        *prev = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r.place + m - 1)));
        *gprev = _mm256_loadu_ps(r.grad + m - 1);
    }
    if ((care & (EDGE | LAST)) && m + LANES8 > ow) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        *cur = _mm256_or_si256(*cur, _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(ow - m - 1)));
        *prev = _mm256_or_si256(*prev, _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(ow - m)));
    }
}

/* MAX: dy where the window's place is tap t, +0 elsewhere; AVE: the window's share */
AVX2 static inline __m256 chosen(int ave, __m256i place, __m256 grad, const __m256i *taps,
                                 int t)
{
    if (ave)
        return grad;
    return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(place, taps[t])), grad);
}

/* The first `count` (1..7) lanes of v at p, from registers (a masked store is microcoded
 * and slow on AMD's Zen; a copy through memory waits for its store to be forwarded) */
AVX2 static inline void store_first(float *p, __m256 v, int64_t count)
{
    __m128 part = _mm256_castps256_ps128(v);
    if (count >= 4) {
        _mm_storeu_ps(p, part);
        part = _mm256_extractf128_ps(v, 1);
        p += 4;
        count -= 4;
    }
    if (count >= 2) {
        _mm_storel_pi((__m64 *)p, part);
        part = _mm_movehl_ps(part, part);
        p += 2;
        count -= 2;
    }
    if (count)
        _mm_store_ss(p, part);
}

/* 8 cells of a row of dx from `start` (which may begin before the row, or end after it) */
AVX2 static inline void store_cells(float *row, int64_t start, int w, __m256 cells)
{
    if (start >= 0 && start + LANES8 <= w) {
        _mm256_storeu_ps(row + start, cells);
    } else if (start >= 0) {
        if (start < w)
            store_first(row + start, cells, w - start);
    } else if (start + LANES8 > 0) {
        const __m256i down = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                              _mm256_set1_epi32((int)-start));
        const int64_t count = start + LANES8 < w ? start + LANES8 : w;     /* under 8 */
        store_first(row, _mm256_permutevar8x32_ps(cells, down), count);
    }
}

/* The 16 cells of a block of pairs of columns from its even and odd cells, clipped to the
 * row where `care` says EDGE */
AVX2 static inline __attribute__((always_inline)) void
store_pairs(float *row, int64_t start, int w, int care, __m256 even, __m256 odd)
{
    const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    if (care & EDGE) {
        store_cells(row, start, w, _mm256_permute2f128_ps(lo, hi, 0x20));
        store_cells(row, start + LANES8, w, _mm256_permute2f128_ps(lo, hi, 0x31));
    } else if (care & OVER) {
        const __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20);
        const __m256 second = _mm256_permute2f128_ps(lo, hi, 0x31);
        const __m256i back = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
        _mm256_storeu_ps(row + start, first);
        _mm256_storeu_ps(row + start + LANES8 - 1,
                         _mm256_blend_ps(_mm256_permutevar8x32_ps(second, back),
                                         _mm256_permutevar8x32_ps(first, back), 1));
    } else {
        _mm256_storeu_ps(row + start, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(row + start + LANES8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
}

/* Pairs m..m + 7 of dx rows 2k (`upper`, from window rows k - 1 = early at tap row 2 and
 * k = late at tap row 0) and 2k + 1 (`lower`, from late at tap row 1), padded, pair m at
 * column 2m - pw. Inlined with constant `rows` (1: upper only, 2: lower only, 3: both),
 * `care` and `ave`. */
AVX2 static inline __attribute__((always_inline)) void
gather_block(window_row early, window_row late, float *upper, float *lower, int rows, int w,
             int pw, int ow, int m, int care, int ave, const __m256i *taps)
{
    const __m256 zero = _mm256_setzero_ps();
    __m256i cur, prev;
    __m256 gcur, gprev;
    windows8(late, m, ow, care, ave, &cur, &gcur, &prev, &gprev);
    const int64_t start = 2 * (int64_t)m - pw;
    if (rows & 2)
        store_pairs(lower, start, w, care,
                    _mm256_add_ps(_mm256_add_ps(zero, chosen(ave, prev, gprev, taps, 5)),
                                  chosen(ave, cur, gcur, taps, 3)),
                    _mm256_add_ps(zero, chosen(ave, cur, gcur, taps, 4)));
    if (rows & 1) {
        __m256i ecur, eprev;
        __m256 egcur, egprev;
        windows8(early, m, ow, care, ave, &ecur, &egcur, &eprev, &egprev);
        __m256 even = _mm256_add_ps(zero, chosen(ave, eprev, egprev, taps, 8));
        even = _mm256_add_ps(even, chosen(ave, ecur, egcur, taps, 6));
        even = _mm256_add_ps(even, chosen(ave, prev, gprev, taps, 2));
        even = _mm256_add_ps(even, chosen(ave, cur, gcur, taps, 0));
        const __m256 odd = _mm256_add_ps(_mm256_add_ps(zero, chosen(ave, ecur, egcur, taps, 7)),
                                         chosen(ave, cur, gcur, taps, 1));
        store_pairs(upper, start, w, care, even, odd);
    }
}

/* A band's `pairs` pairs of columns from column -pw on: blocks inside the rows without
 * care, the first with its window -1 and, where it reaches outside them, as an edge; where
 * there are more than 8 pairs, the last ending at the last pair */
AVX2 static inline __attribute__((always_inline)) void
gather_band(window_row early, window_row late, float *upper, float *lower, int rows, int w,
            int pw, int ow, int pairs, int ave, const __m256i *taps)
{
    if (pw == 0 && LANES8 <= ow && 2 * LANES8 <= w)
        gather_block(early, late, upper, lower, rows, w, pw, ow, 0, FIRST, ave, taps);
    else
        gather_block(early, late, upper, lower, rows, w, pw, ow, 0, FIRST | EDGE, ave, taps);
    if (pairs <= LANES8)
        return;
    const int last = pairs - LANES8;
    int m = LANES8;
    for (; m < last && m + LANES8 <= ow; m += LANES8)
        gather_block(early, late, upper, lower, rows, w, pw, ow, m, 0, ave, taps);
    for (; m < last; m += LANES8)
        gather_block(early, late, upper, lower, rows, w, pw, ow, m, EDGE, ave, taps);
    if (2 * pairs - pw > w)
        gather_block(early, late, upper, lower, rows, w, pw, ow, last, LAST | OVER, ave, taps);
    else
        gather_block(early, late, upper, lower, rows, w, pw, ow, last, LAST, ave, taps);
}

/* Band k of a plane of dx: its rows 2k - ph and 2k + 1 - ph, those inside the plane */
AVX2 static inline __attribute__((always_inline)) void
gather_rows(window_row early, window_row late, float *plane, int k, int h, int w, int ph,
            int pw, int ow, int pairs, int ave, const __m256i *taps)
{
    const int upper = 2 * k - ph, lower = upper + 1;
    float *up = plane + (int64_t)upper * w, *low = up + w;
    if (upper >= 0 && lower < h)
        gather_band(early, late, up, low, 3, w, pw, ow, pairs, ave, taps);
    else if (upper >= 0)
        gather_band(early, late, up, low, 1, w, pw, ow, pairs, ave, taps);
    else
        gather_band(early, late, up, low, 2, w, pw, ow, pairs, ave, taps);
}

/* What a call reads its rows of windows through, and the taps, each in 8 lanes (compared
 * from memory: GCC otherwise builds each anew, a move and a broadcast, where it runs out of
 * registers: 10% slower) */
typedef struct {
    __m256i taps[9];
    const uint8_t *arg, *arg_end;
    const float *dy, *dy_end;
    int oh, ow, reach;
    uint8_t *no_place;           /* `reach` places of no winner, and dy 0: rows outside */
    float *no_grad;
    uint8_t *near_place[2];      /* copies of rows too near the arrays' ends to read whole */
    float *near_grad[2];
} window_rows;

/* Row r of plane p's windows, readable for `reach` entries */
AVX2 static inline __attribute__((always_inline)) window_row
windows_of(const window_rows *rows, int64_t p, int64_t r)
{
    window_row row = {rows->no_place, rows->no_grad};
    if (r < 0 || r >= rows->oh)
        return row;
    const int64_t at = (p * rows->oh + r) * rows->ow;
    row.place = rows->arg + at;
    row.grad = rows->dy + at;
    if (__builtin_expect(row.place + rows->reach > rows->arg_end ||
                         row.grad + rows->reach > rows->dy_end, 0)) {
        uint8_t *place = rows->near_place[r & 1];
        float *grad = rows->near_grad[r & 1];
        memcpy(place, row.place, (size_t)rows->ow);
        memcpy(grad, row.grad, sizeof(float) * (size_t)rows->ow);
        row.place = place;
        row.grad = grad;
    }
    return row;
}

/* dx of the call's planes, band by band (kept out of line: inlined into gather, GCC builds
 * the taps anew again) */
AVX2 __attribute__((noinline)) static void gather_planes(const window_rows *rows, float *dx,
                                                         int64_t planes, int h, int w, int ph,
                                                         int pw)
{
    const int pairs = (w + pw + 1) / 2, ow = rows->ow;
    const int last = (h - 1 + ph) / 2;          /* the band of the last dx row */
    for (int64_t p = 0; p < planes; ++p) {
        float *plane = dx + p * (int64_t)h * w;
        window_row early = windows_of(rows, p, ph / 2 - 1);
        for (int k = ph / 2; k <= last; ++k) {
            const window_row late = windows_of(rows, p, k);   /* the next band's early */
            gather_rows(early, late, plane, k, h, w, ph, pw, ow, pairs, 0, rows->taps);
            early = late;
        }
    }
}

/* AVE: a plane's shares (dy / Caffe's divisor, as Caffe divides), window row r at
 * rows + (r + 1) * stride + 1, bordered by 0 (window -1, windows from ow on, rows -1 and oh),
 * which the division never writes */
AVX2 static void plane_shares(const float *dy, const float *size, float *rows, int oh, int ow,
                              int stride)
{
    for (int r = 0; r < oh; ++r) {
        float *to = rows + (size_t)(r + 1) * stride + 1;
        const float *d = dy + (size_t)r * ow, *z = size + (size_t)r * ow;
        int l = 0;
        for (; l + LANES8 <= ow; l += LANES8)
            _mm256_storeu_ps(to + l, _mm256_div_ps(_mm256_loadu_ps(d + l),
                                                   _mm256_loadu_ps(z + l)));
        for (; l < ow; ++l)
            to[l] = d[l] / z[l];
    }
}

/* Window row r of a plane's shares, or a row of 0 outside the output */
static inline window_row share_row(const float *shares, int r, int oh, int stride)
{
    const window_row row = {NULL, shares + (size_t)(r < 0 || r >= oh ? 0 : r + 1) * stride + 1};
    return row;
}

/* AVE's dx, plane by plane: each plane's shares are made while the plane before takes its
 * sums (their stores have left for the cache when the loads, straddling them, come) */
AVX2 __attribute__((noinline)) static void ave_planes(const float *dy, const float *size,
                                                      float *dx, int64_t planes, int h, int w,
                                                      int oh, int ow, int ph, int pw,
                                                      float *shares[2], int stride)
{
    const int pairs = (w + pw + 1) / 2;
    const int last = (h - 1 + ph) / 2;          /* the band of the last dx row */
    const int64_t outputs = (int64_t)oh * ow;
    plane_shares(dy, size, shares[0], oh, ow, stride);
    for (int64_t p = 0; p < planes; ++p) {
        const float *mine = shares[p & 1];
        if (p + 1 < planes)
            plane_shares(dy + (p + 1) * outputs, size, shares[(p + 1) & 1], oh, ow, stride);
        float *plane = dx + p * (int64_t)h * w;
        for (int k = ph / 2; k <= last; ++k)
            gather_rows(share_row(mine, k - 1, oh, stride), share_row(mine, k, oh, stride),
                        plane, k, h, w, ph, pw, ow, pairs, 1, NULL);
    }
}

/* AVE's call: its two planes of shares (-2 when out of memory) */
static int ave_gather(const float *dy, const float *size, float *dx, int64_t planes, int h,
                      int w, int oh, int ow, int ph, int pw)
{
    /* a block's loads end before entry `reach` of a row, and ow windows and window -1 */
    const int pairs = (w + pw + 1) / 2;
    const int reach = ((pairs + LANES8 - 1) / LANES8) * LANES8;
    const int stride = (reach > ow ? reach : ow) + 1;
    const size_t floats = (size_t)(oh + 2) * stride;
    float *rows = calloc(2 * floats, sizeof(float));
    if (rows == NULL)
        return -2;
    float *shares[2] = {rows, rows + floats};
    ave_planes(dy, size, dx, planes, h, w, oh, ow, ph, pw, shares, stride);
    free(rows);
    return 0;
}

/* The call's rows, its buffers of rows of no window and of rows near the arrays' ends, and
 * its taps: -2 when out of memory */
AVX2 static int gather(const float *dy, const uint8_t *arg, float *dx, int64_t planes, int h,
                       int w, int oh, int ow, int ph, int pw)
{
    /* a block's loads end before entry `reach` of its row: the pairs' blocks, rounded up */
    const int pairs = (w + pw + 1) / 2;
    int reach = ((pairs + LANES8 - 1) / LANES8) * LANES8;
    reach = reach < ow ? ow : reach;
    uint8_t *places = malloc(3 * (size_t)reach);
    float *grads = malloc(3 * sizeof(float) * (size_t)reach);
    if (places == NULL || grads == NULL) {
        free(places);
        free(grads);
        return -2;
    }
    memset(places, NO_WINNER, 3 * (size_t)reach);
    memset(grads, 0, 3 * sizeof(float) * (size_t)reach);
    const int64_t outputs = planes * oh * ow;
    window_rows rows = {{{0}}, arg, arg + outputs, dy, dy + outputs, oh, ow, reach, places,
                        grads, {places + reach, places + 2 * reach},
                        {grads + reach, grads + 2 * reach}};
    for (int t = 0; t < 9; ++t)
        rows.taps[t] = _mm256_set1_epi32(t);
    gather_planes(&rows, dx, planes, h, w, ph, pw);
    free(places);
    free(grads);
    return 0;
}
#endif

int pool_gather_max_backward(const float *dy, const void *arg, int arg_bytes, float *dx,
                             int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                             int sh, int sw, int ph, int pw)
{
    if (arg_bytes != 1 || !serves(w, kh, kw, sh, sw, ph, pw))
        return -2;
#if HAVE_AVX2
    return gather(dy, arg, dx, planes, h, w, oh, ow, ph, pw);
#else
    (void)dy, (void)arg, (void)dx, (void)planes, (void)h, (void)w, (void)oh, (void)ow;
    return -2;
#endif
}

int pool_gather_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                             int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                             int ph, int pw)
{
    if (!serves(w, kh, kw, sh, sw, ph, pw))
        return -2;
#if HAVE_AVX2
    return ave_gather(dy, size, dx, planes, h, w, oh, ow, ph, pw);
#else
    (void)dy, (void)dx, (void)size, (void)planes, (void)h, (void)w, (void)oh, (void)ow;
    return -2;
#endif
}
