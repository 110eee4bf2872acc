/* 2-D MAX pooling whose columns step by 2 (AlexNet's, GoogLeNet's and VGG's 3x3 and 2x2
 * poolings of stride 2), forward, on AVX-512 (pooling.c calls it first).
 *
 * 16 outputs of a row are one vector: the 48 input cells from their first window's first
 * column are three loads a window row, and each column tap t of the 16 (cells t + 2 l) one
 * permute of them (two where a lane reaches the third load). No layout copy and no
 * transpose (pool_lanes.c lays 16 planes side by side through registers, 16 cells at a time):
 * 5-22% faster on those nets' poolings, one thread.
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

int pool_stride2_max_forward(const float *x, float *y, void *arg, int arg_bytes,
                             int64_t planes, int h, int w, int oh, int ow, int kh, int kw,
                             int sh, int sw, int ph, int pw)
{
    if (!serves(h, w, oh, ow, kh, kw, sh, sw, ph, pw, arg_bytes))
        return -2;
#if HAVE_AVX512
    return stride2_forward(x, y, arg, arg_bytes, planes, h, w, oh, ow, kh, kw, sh, ph, pw);
#endif
    return -2;
}
