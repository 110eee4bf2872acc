/* 2-D MAX and AVE pooling with 16 planes side by side, one in each lane of an AVX-512
 * vector (pooling.c's passes call these first where the CPU has AVX-512).
 *
 * pooling.c's phased layout makes each window tap one loop over a group of planes; on the
 * small maps of LeNet and CIFAR-10 (8x8 to 32x32) its rows are 4 to 16 cells long, and the
 * copies into the layout and the loops' starts cost more than the comparisons. Here 16 planes
 * are laid out cell by cell, (cells, 16 lanes), so every window tap of every output is one
 * vector of 16 planes, whatever the window, stride or padding; the copies in and out move 16
 * cells of 16 planes at a time, transposed in registers. Planes larger than LANE_CELLS cells
 * take the phased layout.
 *
 * Values are the phased passes': MAX visits a window's input cells in row-major order, a cell
 * taking over only when strictly greater (the first maximum wins, as in Caffe), and a NaN
 * becomes the maximum without moving the winner; AVE adds the window's cells in row-major
 * order from 0 and divides by Caffe's size; its backward adds each output's share to its
 * cells in the outputs' row-major order. Each returns 0, -1 when out of memory, -2 where it
 * does not serve (no AVX-512, or planes too large).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx512.h"
#include "pool_window.h"
#if HAVE_AVX512
#include "transpose16.h"
#endif
#define HAVE_LANES HAVE_AVX512

#define LANES 16
/* the most cells a plane may have: the 16 planes' copy (64 bytes a cell, 1 MB) then still
 * fits a core's L2 cache here (GoogLeNet's first pooling, 112x112: 12.0 ms against the
 * phased layout's 13.5, its 56x56 7.3 against 11.5) */
#define LANE_CELLS 16384

int pool_lanes_serve(int64_t cells)
{
    return cpu_has_avx512() && cells <= LANE_CELLS;
}

#if HAVE_LANES
/* t[c][l] = x[l * pitch + c] for cells c < cells and lanes l < count (0 in the others): 16
 * cells of each plane loaded as one vector, transposed in registers. (A gather a cell reads
 * 16 planes' lines at once; planes of 4 KB share the L1 cache's sets and evict each other.) */
AVX512 static void gather_planes(const float *x, int64_t pitch, int64_t count, int64_t cells,
                                 float *t)
{
    for (int64_t c = 0; c < cells; c += LANES) {
        __mmask16 keep = first_lanes(cells - c);
        __m512 r[LANES];
        for (int l = 0; l < LANES; ++l)
            r[l] = l < count ? _mm512_maskz_loadu_ps(keep, x + l * pitch + c)
                             : _mm512_setzero_ps();
        transpose16(r);
        for (int k = 0; k < LANES && c + k < cells; ++k)
            _mm512_store_ps(t + (c + k) * LANES, r[k]);
    }
}

/* The other way: y[l * pitch + c] = t[c][l] for lanes l < count. */
AVX512 static void spread_planes(const float *t, int64_t cells, int64_t count, float *y,
                                 int64_t pitch)
{
    for (int64_t c = 0; c < cells; c += LANES) {
        __mmask16 keep = first_lanes(cells - c);
        __m512 r[LANES];
        for (int k = 0; k < LANES; ++k)
            r[k] = c + k < cells ? _mm512_load_ps(t + (c + k) * LANES) : _mm512_setzero_ps();
        transpose16(r);
        for (int l = 0; l < count; ++l)
            _mm512_mask_storeu_ps(y + l * pitch + c, keep, r[l]);
    }
}

/* The winners likewise, as int32 or as their low byte (arg_bytes 1 or 4). */
AVX512 static void spread_winners(const int32_t *t, int64_t cells, int64_t count, void *arg,
                                  int arg_bytes, int64_t pitch)
{
    for (int64_t c = 0; c < cells; c += LANES) {
        __mmask16 keep = first_lanes(cells - c);
        __m512 r[LANES];
        for (int k = 0; k < LANES; ++k)
            r[k] = c + k < cells ? _mm512_load_ps((const float *)t + (c + k) * LANES)
                                 : _mm512_setzero_ps();
        transpose16(r);
        for (int l = 0; l < count; ++l) {
            __m512i v = _mm512_castps_si512(r[l]);
            if (arg_bytes == 1)
                _mm512_mask_cvtepi32_storeu_epi8((uint8_t *)arg + l * pitch + c, keep, v);
            else
                _mm512_mask_storeu_epi32((int32_t *)arg + l * pitch + c, keep, v);
        }
    }
}

/* One tap of MAX for one output's lanes: the value takes over where strictly greater (the
 * winner moves) or NaN (the winner stays). */
#define MAX_TAP(best, at, value, tap)                                                    \
    do {                                                                                 \
        __mmask16 greater_ = _mm512_cmp_ps_mask(value, best, _CMP_GT_OQ);                \
        __mmask16 nan_ = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);                 \
        best = _mm512_mask_mov_ps(best, greater_ | nan_, value);                         \
        at = _mm512_mask_mov_epi32(at, greater_, tap);                                   \
    } while (0)

/* Four outputs side by side in a row whose windows lie wholly inside the input (row r0,
 * columns c0, c0 + sw, ...): four independent chains of taps, where one output's chain waits
 * on each compare (a stride-1 3x3 pooling ran at a third of the bandwidth). */
AVX512 static void max_lanes_four(const float *t, const window2d *g, int r0, int c0,
                                  float *best_out, int32_t *at_out)
{
    __m512 best[4];
    __m512i at[4];
    for (int k = 0; k < 4; ++k) {
        best[k] = _mm512_set1_ps(-INFINITY);
        at[k] = _mm512_setzero_si512();
    }
    for (int u = 0; u < g->kh; ++u)
        for (int v = 0; v < g->kw; ++v) {
            const float *cell = t + ((size_t)(r0 + u) * g->w + c0 + v) * LANES;
            __m512i tap = _mm512_set1_epi32(u * g->kw + v);
            for (int k = 0; k < 4; ++k) {
                __m512 value = _mm512_load_ps(cell + (size_t)k * g->sw * LANES);
                MAX_TAP(best[k], at[k], value, tap);
            }
        }
    for (int k = 0; k < 4; ++k) {
        _mm512_store_ps(best_out + k * LANES, best[k]);
        _mm512_store_si512(at_out + k * LANES, at[k]);
    }
}

/* Each output's maximum and winner (its place in the window, -1 for an empty window, whose
 * output is -FLT_MAX), for the 16 planes of t. */
AVX512 static void max_lanes(const float *t, const window2d *g, float *best_out,
                             int32_t *at_out)
{
    for (int i = 0; i < g->oh; ++i)
        for (int j = 0; j < g->ow; ++j) {
            int r0 = i * g->sh - g->ph, c0 = j * g->sw - g->pw;
            if (r0 >= 0 && r0 + g->kh <= g->h && c0 >= 0 && j + 4 <= g->ow &&
                c0 + 3 * g->sw + g->kw <= g->w) {
                size_t o = ((size_t)i * g->ow + j) * LANES;
                max_lanes_four(t, g, r0, c0, best_out + o, at_out + o);
                j += 3;
                continue;
            }
            int hs, he, ws, we;
            clip(g, i, j, &hs, &he, &ws, &we);
            int empty = hs >= he || ws >= we;
            __m512 best = _mm512_set1_ps(-INFINITY);
            __m512i at = _mm512_set1_epi32(empty ? -1 : (hs - r0) * g->kw + ws - c0);
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v) {
                    __m512 value = _mm512_load_ps(t + ((size_t)u * g->w + v) * LANES);
                    MAX_TAP(best, at, value, _mm512_set1_epi32((u - r0) * g->kw + v - c0));
                }
            size_t o = ((size_t)i * g->ow + j) * LANES;
            _mm512_store_ps(best_out + o, empty ? _mm512_set1_ps(-FLT_MAX) : best);
            _mm512_store_si512(at_out + o, at);
        }
}

/* 16 lanes for each of `cells` cells, aligned for whole-vector loads (free: _mm_free). */
static float *lane_buffer(int64_t cells)
{
    return _mm_malloc(sizeof(float) * LANES * (size_t)(cells > 0 ? cells : 1), 64);
}
#endif

/* MAX: y and arg (arg_bytes 1 or 4) as pool_max_forward's. */
int pool_lanes_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                           int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                           int ph, int pw)
{
#if HAVE_LANES
    if (!pool_lanes_serve((int64_t)h * w))
        return -2;
    window2d g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    int64_t cells = (int64_t)h * w, outputs = (int64_t)oh * ow;
    float *t = lane_buffer(cells), *best = lane_buffer(outputs);
    int32_t *at = (int32_t *)lane_buffer(outputs);
    if (t == NULL || best == NULL || at == NULL) {
        _mm_free(t);
        _mm_free(best);
        _mm_free(at);
        return -1;
    }
    for (int64_t p = 0; p < planes; p += LANES) {
        int64_t count = planes - p < LANES ? planes - p : LANES;
        gather_planes(x + p * cells, cells, count, cells, t);
        /* the next 16 planes on their way while these are compared (from memory, one
         * thread: VGG's 8x8 pool4 at 64x64 0.99 -> 0.76 ms) */
        if (p + 2 * LANES <= planes)
            for (int64_t c = 0; c < LANES * cells; c += LANES)
                _mm_prefetch((const char *)(x + (p + LANES) * cells + c), _MM_HINT_T0);
        max_lanes(t, &g, best, at);
        spread_planes(best, outputs, count, y + p * outputs, outputs);
        spread_winners(at, outputs, count, (char *)arg + p * outputs * arg_bytes, arg_bytes,
                       outputs);
    }
    _mm_free(t);
    _mm_free(best);
    _mm_free(at);
    return 0;
#else
    (void)x, (void)y, (void)arg, (void)arg_bytes, (void)planes, (void)h, (void)w, (void)oh;
    (void)ow, (void)kh, (void)kw, (void)sh, (void)sw, (void)ph, (void)pw;
    return -2;
#endif
}

#if HAVE_LANES
/* Each output's window sum over Caffe's size, for the 16 planes of t. */
AVX512 static void ave_lanes(const float *t, const window2d *g, const float *size, float *y)
{
    for (int i = 0; i < g->oh; ++i)
        for (int j = 0; j < g->ow; ++j) {
            int hs, he, ws, we;
            clip(g, i, j, &hs, &he, &ws, &we);
            __m512 sum = _mm512_setzero_ps();
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v)
                    sum = _mm512_add_ps(sum, _mm512_load_ps(t + ((size_t)u * g->w + v) *
                                                            LANES));
            _mm512_store_ps(y + ((size_t)i * g->ow + j) * LANES,
                            _mm512_div_ps(sum, _mm512_set1_ps(size[i * g->ow + j])));
        }
}

/* d (cells, 16 lanes) = each output's dy over its size added to its window's cells, the
 * outputs in row-major order. */
AVX512 static void ave_lanes_backward(const float *dy, const window2d *g, const float *size,
                                      float *d)
{
    memset(d, 0, sizeof(float) * LANES * (size_t)g->h * g->w);
    for (int i = 0; i < g->oh; ++i)
        for (int j = 0; j < g->ow; ++j) {
            int hs, he, ws, we;
            clip(g, i, j, &hs, &he, &ws, &we);
            __m512 share = _mm512_div_ps(
                _mm512_load_ps(dy + ((size_t)i * g->ow + j) * LANES),
                _mm512_set1_ps(size[i * g->ow + j]));
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v) {
                    float *cell = d + ((size_t)u * g->w + v) * LANES;
                    _mm512_store_ps(cell, _mm512_add_ps(_mm512_load_ps(cell), share));
                }
        }
}
#endif

#if HAVE_LANES
/* AVE forward (from x to y) or backward (from dy to dx) of every plane, 16 at a time. */
static int ave_planes(const float *from, float *to, const float *size, int64_t planes,
                      const window2d *g, int backward)
{
    int64_t cells = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    int64_t ins = backward ? outputs : cells, outs = backward ? cells : outputs;
    float *t = lane_buffer(ins), *out = lane_buffer(outs);
    if (t == NULL || out == NULL) {
        _mm_free(t);
        _mm_free(out);
        return -1;
    }
    for (int64_t p = 0; p < planes; p += LANES) {
        int64_t count = planes - p < LANES ? planes - p : LANES;
        gather_planes(from + p * ins, ins, count, ins, t);
        if (backward)
            ave_lanes_backward(t, g, size, out);
        else
            ave_lanes(t, g, size, out);
        spread_planes(out, outs, count, to + p * outs, outs);
    }
    _mm_free(t);
    _mm_free(out);
    return 0;
}
#endif

/* AVE: y as pool_ave_forward's; `size` holds Caffe's divisor of each output. */
int pool_lanes_ave_forward(const float *x, float *y, const float *size, int64_t planes, int h,
                           int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                           int pw)
{
#if HAVE_LANES
    if (!pool_lanes_serve((int64_t)h * w))
        return -2;
    window2d g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    return ave_planes(x, y, size, planes, &g, 0);
#else
    (void)x, (void)y, (void)size, (void)planes, (void)h, (void)w, (void)oh, (void)ow;
    (void)kh, (void)kw, (void)sh, (void)sw, (void)ph, (void)pw;
    return -2;
#endif
}

/* AVE's backward: dx as pool_ave_backward's. */
int pool_lanes_ave_backward(const float *dy, float *dx, const float *size, int64_t planes,
                            int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                            int ph, int pw)
{
#if HAVE_LANES
    if (!pool_lanes_serve((int64_t)h * w))
        return -2;
    window2d g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    return ave_planes(dy, dx, size, planes, &g, 1);
#else
    (void)dy, (void)dx, (void)size, (void)planes, (void)h, (void)w, (void)oh, (void)ow;
    (void)kh, (void)kw, (void)sh, (void)sw, (void)ph, (void)pw;
    return -2;
#endif
}
