/* 2-D MAX pooling whose columns step by 2 (AlexNet's, GoogLeNet's and VGG's 3x3 and 2x2
 * poolings of stride 2), forward, on AVX-512 (pooling.c calls it first).
 *
 * 16 outputs of a row are one vector: the 48 input cells from their first window's first
 * column are three loads a window row, and each column tap t of the 16 (cells t + 2 l) one
 * permute of them (two where a lane reaches the third load). No layout copy and no
 * transpose (pool_lanes.c lays 16 planes side by side through registers, 16 cells at a time):
 * 5-22% faster on those nets' poolings, one thread. 3x3 windows stepping by 2 on both axes
 * (padding 0 or 1, winners in bytes) go a window's rows first where the CPU has AVX-512's byte
 * lanes (rows3_forward below).
 *
 * Values are pooling.c's: the window's cells in row-major order from its first cell inside
 * the input (cells outside load as -inf, never greater), one taking over only when strictly
 * greater, a NaN becoming the maximum without moving the winner; the winner's place (row tap
 * * kw + column tap) in a byte or an int32. The backward is pool_gather.c's for 3x3 windows
 * (AVX2), else pooling.c's scatter: a vector scatter of every other cell, its sums kept in the
 * outputs' order, ran slower than it (the pass is bound by dx's memory, written where its
 * lines were first read, and a buffered plane streamed out ran slower still here). Returns
 * 0, -1 when out of memory, or -2 where it does not serve (no AVX-512, a stride of columns
 * other than 2, a row of fewer than MIN_OUTPUTS outputs, where pool_lanes.c's 16 planes a
 * vector fill more lanes, a window wider than MAX_KW, or one that may hold no input cell).
 */
#include <stdint.h>
#include <stdlib.h>

#include "avx512.h"
#include "max_rows3.h"

#define LANES 16
/* rows of fewer outputs leave too many of a vector's 16 lanes empty (AlexNet's 13x13 pool2
 * already ran faster here, VGG's 8x8 and 4x4 did not) */
#define MIN_OUTPUTS 12
/* the widest window: a tap of 16 outputs reaches 30 + kw cells, within three vectors */
#define MAX_KW 18

static int serves(int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                  int pw, int arg_bytes)
{
    return HAVE_AVX512 && cpu_has_avx512() && sw == 2 && ow >= MIN_OUTPUTS && kw <= MAX_KW &&
        (arg_bytes == 1 || arg_bytes == 4) && ph < kh && pw < kw &&
        (int64_t)(oh - 1) * sh - ph < h && (int64_t)(ow - 1) * sw - pw < w;
}

#if HAVE_AVX512
/* The three vectors of cells [start, start + 48) of a row: which lie inside [0, w). */
static inline void row_cells(int start, int w, __mmask16 m[3])
{
    for (int s = 0; s < 3; ++s) {
        int64_t lo = (int64_t)start + 16 * s;
        uint32_t bits = 0xFFFF;
        if (lo < 0)
            bits = lo <= -16 ? 0 : bits & ~((1u << -lo) - 1);
        if (lo + 16 > w)
            bits = lo >= w ? 0 : bits & ((1u << (w - lo)) - 1);
        m[s] = (__mmask16)bits;
    }
}

/* For each block of 16 outputs of a row, from its first window's first column (2 j0 - pw),
 * which of its 48 cells lie inside the row. NULL when out of memory. */
static __mmask16 *block_cells(int w, int ow, int pw)
{
    int blocks = (ow + LANES - 1) / LANES;
    __mmask16 *cells = malloc(sizeof(__mmask16) * 3 * (size_t)blocks);
    if (cells == NULL)
        return NULL;
    for (int b = 0; b < blocks; ++b)
        row_cells(2 * b * LANES - pw, w, cells + 3 * b);
    return cells;
}

/* Tap t of 16 outputs picked from the 48 cells v[0..2] of their row: cells t + 2 l. */
typedef struct {
    __m512i pair;       /* (t + 2 l) mod 32, from v[0] and v[1] */
    __m512i third;      /* t + 2 l - 32, from v[2] */
    __mmask16 past;     /* the lanes taken from v[2] */
} pick;

AVX512 static void make_picks(pick *picks, int kw)
{
    for (int t = 0; t < kw; ++t) {
        int32_t pair[LANES], third[LANES];
        picks[t].past = 0;
        for (int l = 0; l < LANES; ++l) {
            int k = t + 2 * l;
            pair[l] = k & 31;
            third[l] = k >= 32 ? k - 32 : 0;
            if (k >= 32)
                picks[t].past |= (__mmask16)(1u << l);
        }
        picks[t].pair = _mm512_loadu_si512(pair);
        picks[t].third = _mm512_loadu_si512(third);
    }
}

AVX512 static int stride2_forward(const float *x, float *y, void *arg, int arg_bytes,
                                  int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                                  int sh, int ph, int pw)
{
    const __m512i twice = _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                               11, 12, 13, 14, 15), 1);
    const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
    pick picks[MAX_KW];
    make_picks(picks, kw);
    const __mmask16 extra = (__mmask16)(kw > 2 ? (1u << (kw - 2)) - 1 : 0);
    __mmask16 *cells = block_cells(w, ow, pw);
    if (cells == NULL)
        return -1;
    for (int64_t p = 0; p < planes; ++p) {
        const float *xp = x + p * (int64_t)h * w;
        for (int i = 0; i < oh; ++i) {
            const int top = i * sh - ph;
            const int a0 = top < 0 ? -top : 0;
            const int a1 = top + kh > h ? h - top : kh;
            const int64_t out = (p * oh + i) * (int64_t)ow;
            for (int j0 = 0; j0 < ow; j0 += LANES) {
                const int n = ow - j0 < LANES ? ow - j0 : LANES;
                const int left = 2 * j0 - pw;
                const __mmask16 *m = cells + 3 * (j0 / LANES);
                /* each window's first cell inside the input is its winner until a greater
                 * comes (the cells outside are -inf, never greater) */
                __m512i at = _mm512_max_epi32(_mm512_setzero_si512(),
                                              _mm512_sub_epi32(_mm512_set1_epi32(-left), twice));
                at = _mm512_add_epi32(at, _mm512_set1_epi32(a0 * kw));
                __m512 best = lowest;
                for (int a = a0; a < a1; ++a) {
                    /* a row's 48 cells loaded once, each tap picked from them */
                    const float *from = xp + (int64_t)(top + a) * w + left;
                    const __m512 v0 = _mm512_mask_loadu_ps(lowest, m[0], from);
                    const __m512 v1 = _mm512_mask_loadu_ps(lowest, m[1], from + 16);
                    const __m512 v2 = _mm512_mask_loadu_ps(lowest, m[2] & extra, from + 32);
                    for (int t = 0; t < kw; ++t) {
                        __m512 value = _mm512_permutex2var_ps(v0, picks[t].pair, v1);
                        if (picks[t].past)
                            value = _mm512_mask_permutexvar_ps(value, picks[t].past,
                                                               picks[t].third, v2);
                        const __mmask16 greater = _mm512_cmp_ps_mask(value, best, _CMP_GT_OQ);
                        const __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
                        best = _mm512_mask_mov_ps(best, greater | nan, value);
                        at = _mm512_mask_mov_epi32(at, greater, _mm512_set1_epi32(a * kw + t));
                    }
                }
                const __mmask16 lanes = first_lanes(n);
                _mm512_mask_storeu_ps(y + out + j0, lanes, best);
                if (arg_bytes == 1)
                    _mm512_mask_cvtepi32_storeu_epi8((uint8_t *)arg + out + j0, lanes, at);
                else
                    _mm512_mask_storeu_epi32((int32_t *)arg + out + j0, lanes, at);
            }
        }
    }
    free(cells);
    return 0;
}
#endif

#if HAVE_AVX512
/* 3x3 windows of stride 2 on both axes, padding 0 or 1, a window's rows first (with
 * AVX-512's byte lanes): an input row's results for 16 outputs, the first maximum of their
 * windows' three cells in the row and its column tap, from its even cells (tap 0), odd ones
 * (tap 1) and the evens two cells on (tap 2), three permutes and 2 comparisons; each output
 * row then takes its three rows' (a later row only where strictly greater), the last one kept
 * for the next output row, whose first it is: 4 comparisons an output and 6 permutes where
 * the taps took 9 and 9 NaN tests and 9-12 permutes. The first maximum in row-major order is
 * the first, in row order, of the rows' first maxima; a window's first cell inside is its
 * first row's first inside. A NaN breaks that rule: a plane that holds one in a window is
 * taken again by the taps. On a Xeon, one thread, one process: GoogLeNet's 112x112 pool1,
 * 56x56 pool2 and 28x28 pool3 and AlexNet's 55x55 pool1 in the L2 cache 0.6 of the taps'
 * time; in the nets' flow 0.53-0.72 (GoogLeNet's pool1 15-20 -> 8 ms). */

/* Input rows ahead (into the next planes) whose lines are asked for as a block's are read,
 * and outputs ahead whose lines are asked for writing (a store that misses waits for its
 * line): GoogLeNet's 28x28 and AlexNet's 27x27 planes out of cache 0.8-0.85 of the time with
 * 12 rows, against 4 within the plane */
#define ROWS_AHEAD 12
#define OUTPUTS_AHEAD 1024

/* A block of 16 outputs of a row: its cells' masks inside the row, from its first window's
 * first column (left) on: [left, left + 32) and [left + 2, left + 34) in 16s, and the lanes
 * whose tap 0 lies inside */
typedef struct {
    __mmask16 cells[2], later[2], first;
} block3;

/* The results of a row (`row` its cell 0) for block b's 16 outputs: *value and *column; a
 * NaN in the cells of the lanes `outputs` sets *nan */
AVX512BW static inline __attribute__((always_inline)) void
row3(const float *row, int left, const block3 *b, __m512 *value, __m128i *column,
     __mmask16 outputs, __mmask16 *nan)
{
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                            28, 30);
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
    const float *from = row + left;
    const __m512 t0 = _mm512_permutex2var_ps(
        _mm512_mask_loadu_ps(minus_inf, b->cells[0], from), evens,
        _mm512_mask_loadu_ps(minus_inf, b->cells[1], from + LANES));
    const __m512 t1 = _mm512_permutex2var_ps(
        _mm512_mask_loadu_ps(minus_inf, b->cells[0], from), odds,
        _mm512_mask_loadu_ps(minus_inf, b->cells[1], from + LANES));
    const __m512 t2 = _mm512_permutex2var_ps(
        _mm512_mask_loadu_ps(minus_inf, b->later[0], from + 2), evens,
        _mm512_mask_loadu_ps(minus_inf, b->later[1], from + 2 + LANES));
    *nan |= _mm512_mask_cmp_ps_mask(outputs, t0, t1, _CMP_UNORD_Q) |
        _mm512_mask_cmp_ps_mask(outputs, t2, t2, _CMP_UNORD_Q);
    const __m128i none = _mm_setzero_si128();
    *value = first_of_three(t0, t1, t2, none, none, none, (__mmask16)~b->first, 1, column);
}

/* A plane's outputs; whether a window held a NaN (the outputs are then to be made again).
 * `kept`, `kept_column`: a row's results a block; `end`: the call's input's end */
AVX512BW static int rows3_plane(const float *x, float *y, uint8_t *arg, int h, int w, int oh,
                                int ow, int ph, int pw, const block3 *blocks, __m512 *kept,
                                __m128i *kept_column, const float *end)
{
    const int count = (ow + LANES - 1) / LANES;
    const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
    __mmask16 nan = 0;
    for (int i = 0; i < oh; ++i) {
        const int top = 2 * i - ph;
        const float *next = x + (int64_t)(top + ROWS_AHEAD) * w;
        if (next + 2 * w > end)
            next = x;                   /* near the call's end: lines already read */
        for (int k = 0; k < count; ++k) {
            const int j0 = k * LANES, left = 2 * j0 - pw;
            const __mmask16 outputs = first_lanes(ow - j0);
            const block3 *b = blocks + k;
            for (int line = 0; line < 2 * LANES; line += LANES) {
                __builtin_prefetch(next + 2 * j0 + line, 0, 3);
                __builtin_prefetch(next + w + 2 * j0 + line, 0, 3);
            }
            __builtin_prefetch(y + (int64_t)i * ow + j0 + OUTPUTS_AHEAD, 1, 3);
            __m512 upper = minus_inf, middle = minus_inf, lower = minus_inf;
            __m128i upper_at = _mm_setzero_si128(), middle_at = upper_at, lower_at = upper_at;
            if (i > 0) {
                upper = kept[k];
                upper_at = kept_column[k];
            } else if (top >= 0) {
                row3(x + (int64_t)top * w, left, b, &upper, &upper_at, outputs, &nan);
            }
            if (top + 1 < h)
                row3(x + (int64_t)(top + 1) * w, left, b, &middle, &middle_at, outputs, &nan);
            if (top + 2 < h)
                row3(x + (int64_t)(top + 2) * w, left, b, &lower, &lower_at, outputs, &nan);
            kept[k] = lower;
            kept_column[k] = lower_at;
            __m128i at;
            const __m512 best = first_of_three(upper, middle, lower, upper_at, middle_at,
                                               lower_at, (__mmask16)(top < 0 ? 0xFFFF : 0), 3,
                                               &at);
            const int64_t out = (int64_t)i * ow + j0;
            _mm512_mask_storeu_ps(y + out, outputs, best);
            _mm_mask_storeu_epi8(arg + out, outputs, at);
        }
    }
    return nan != 0;
}

AVX512BW static int rows3_forward(const float *x, float *y, uint8_t *arg, int64_t planes, int h,
                                  int w, int oh, int ow, int ph, int pw)
{
    const int count = (ow + LANES - 1) / LANES;
    block3 *blocks = malloc(sizeof(block3) * (size_t)count);
    __m512 *kept = _mm_malloc(sizeof(__m512) * (size_t)count, 64);
    __m128i *kept_column = _mm_malloc(sizeof(__m128i) * (size_t)count, 16);
    if (blocks == NULL || kept == NULL || kept_column == NULL) {
        free(blocks);
        _mm_free(kept);
        _mm_free(kept_column);
        return -1;
    }
    for (int k = 0; k < count; ++k) {
        const int left = 2 * k * LANES - pw;
        __mmask16 m[3];
        row_cells(left, w, m);
        blocks[k].cells[0] = m[0];
        blocks[k].cells[1] = m[1];
        row_cells(left + 2, w, m);
        blocks[k].later[0] = m[0];
        blocks[k].later[1] = m[1];
        blocks[k].first = (__mmask16)(left < 0 ? 0xFFFF << ((-left + 1) / 2) : 0xFFFF);
    }
    const int64_t cells = (int64_t)h * w, outputs = (int64_t)oh * ow;
    int status = 0;
    for (int64_t p = 0; p < planes && status == 0; ++p)
        if (rows3_plane(x + p * cells, y + p * outputs, arg + p * outputs, h, w, oh, ow, ph, pw,
                        blocks, kept, kept_column, x + planes * cells))
            status = stride2_forward(x + p * cells, y + p * outputs, arg + p * outputs, 1, 1, h,
                                     w, oh, ow, 3, 3, 2, ph, pw);
    free(blocks);
    _mm_free(kept);
    _mm_free(kept_column);
    return status;
}
#endif

int pool_stride2_max_forward(const float *x, float *y, void *arg, int arg_bytes,
                             int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                             int sh, int sw, int ph, int pw)
{
    if (!serves(h, w, oh, ow, kh, kw, sh, sw, ph, pw, arg_bytes))
        return -2;
#if HAVE_AVX512
    if (kh == 3 && kw == 3 && sh == 2 && ph <= 1 && pw <= 1 && arg_bytes == 1 &&
        cpu_has_avx512bw())
        return rows3_forward(x, y, arg, planes, h, w, oh, ow, ph, pw);
    return stride2_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh, kw, sh, ph, pw);
#endif
    return -2;
}
