/* 2-D MAX and AVE pooling, forward, with 8 planes side by side, one in each lane of an AVX2
 * vector: pool_lanes.c's way for CPUs that have AVX2 but not AVX-512 (an AMD EPYC's), on planes
 * of up to LANE_CELLS cells, where the phased layout's copies and loops' starts cost the most
 * (GoogLeNet's 14x14 inception pools ran at 4-7% of the memory's rate there, VGG's 4x4 pool5
 * at 3%; AVE: GoogLeNet's auxiliary heads 4.7 -> 3.1 ms, CIFAR-10 quick's pool3 0.74 -> 0.17).
 * pooling.c calls it first where the CPU has no AVX-512 (pool_lanes8_first), for MAX after
 * pool_rows.c.
 *
 * 8 planes are laid out cell by cell, (cells, 8 lanes), so every window tap of every output is
 * one vector of 8 planes, whatever the window, stride or padding; the copies in and out move
 * 8 cells of 8 planes at a time, transposed in registers. Outputs whose windows are whole
 * (AVE's in a layout bordered by zeros; MAX's where no window is clipped) go several side
 * by side, each a chain of its own, and planes of few outputs several groups of 8 planes at
 * once. Values are pool_lanes.c's: a window's input cells in row-major order, a cell taking
 * over only when strictly greater, a NaN becoming the maximum without moving the winner, an
 * empty window's output -FLT_MAX with no winner; AVE's sum from 0 in the same order, over
 * Caffe's divisor. Returns 0, -1 when out of memory, -2 where it does not serve (no AVX2, or
 * planes of more than LANE_CELLS cells, which the phased layout serves as well).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2.h"
#include "fetch_ahead.h"
#include "max_tap8.h"
#include "pool_window.h"

#define LANES 8
/* the most cells a plane may have: on larger planes the phased layout ran as fast or faster
 * (AlexNet's 55x55 pool1 7.7 ms against 7.8, VGG's 64x64 pool1 5.2 against 5.8, 32x32 and
 * 27x27 planes alike), on smaller ones slower (GoogLeNet's 14x14 inception pools 16.0 against
 * 9.9, VGG's 16x16 pool3 2.2 against 1.1, LeNet's 24x24 pool1 1.0 against 0.7) */
#define LANE_CELLS 900

/* 1 (the default): where the CPU has AVX-512, pool_lanes.c's passes serve first; 0: this
 * file's serve wherever the CPU has AVX2 (the tests take both) */
int pool_lanes8_after_avx512 = 1;

/* Whether pooling.c should call pool_lanes8_max_forward first: AVX2, and either no AVX-512 or
 * `pool_lanes8_after_avx512` off. */
int pool_lanes8_first(void)
{
    return HAVE_AVX2 && cpu_has_avx2() && !(pool_lanes8_after_avx512 && cpu_has_avx512());
}

#if HAVE_AVX2
/* r[k][l] = r[l][k] */
AVX2 static inline void transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        s[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int k = 0; k < 4; ++k) {
        r[k] = _mm256_permute2f128_ps(s[k], s[k + 4], 0x20);
        r[k + 4] = _mm256_permute2f128_ps(s[k], s[k + 4], 0x31);
    }
}

/* t[c][l] = x[l * pitch + c] for cells c < cells and lanes l < count (0 in the others) */
AVX2 static void gather_planes8(const float *x, int64_t pitch, int64_t count, int64_t cells,
                                float *t)
{
    for (int64_t c = 0; c < cells; c += LANES) {
        const __m256i keep = first_lanes8(cells - c);
        __m256 r[LANES];
        for (int l = 0; l < LANES; ++l)
            r[l] = l < count ? _mm256_maskload_ps(x + l * pitch + c, keep)
                             : _mm256_setzero_ps();
        transpose8(r);
        for (int k = 0; k < LANES && c + k < cells; ++k)
            _mm256_store_ps(t + (c + k) * LANES, r[k]);
    }
}

/* The other way: y[l * cells + c] = t[c][l] for lanes l < count, planes side by side. A
 * short last vector of a plane is stored whole, over the next plane's first outputs (an
 * AMD's masked store takes tens of cycles; VGG's 4x4 pool5, 4 outputs a plane, spent most of
 * its time in them): the vectors go from the last to the first, so what lands there is
 * stored again after. Past the last lane's outputs only where `spill`: 8 outputs at least
 * come after them. */
AVX2 static void spread_planes8(const float *t, int64_t cells, int64_t count, float *y,
                                int spill)
{
    for (int64_t c = (cells - 1) / LANES * LANES; c >= 0; c -= LANES) {
        const __m256i keep = first_lanes8(cells - c);
        __m256 r[LANES];
        for (int k = 0; k < LANES; ++k)
            r[k] = c + k < cells ? _mm256_load_ps(t + (c + k) * LANES) : _mm256_setzero_ps();
        transpose8(r);
        for (int l = 0; l < count; ++l)
            if (spill || l * cells + c + LANES <= count * cells)
                _mm256_storeu_ps(y + l * cells + c, r[l]);
            else
                _mm256_maskstore_ps(y + l * cells + c, keep, r[l]);
    }
}

/* The winners likewise, as int32 or as their low byte (arg_bytes 1 or 4; -1, no winner, is
 * 255 as a byte); bytes 8 a store, a short last vector's spilling as spread_planes8's. */
AVX2 static void spread_winners8(const int32_t *t, int64_t cells, int64_t count, void *arg,
                                 int arg_bytes, int spill)
{
    for (int64_t c = (cells - 1) / LANES * LANES; c >= 0; c -= LANES) {
        const int n = cells - c < LANES ? (int)(cells - c) : LANES;
        __m256 r[LANES];
        for (int k = 0; k < LANES; ++k)
            r[k] = k < n ? _mm256_load_ps((const float *)t + (c + k) * LANES)
                         : _mm256_setzero_ps();
        transpose8(r);
        for (int l = 0; l < count; ++l) {
            const int whole = spill || l * cells + c + LANES <= count * cells;
            if (arg_bytes == 4) {
                float *to = (float *)((int32_t *)arg + l * cells + c);
                if (whole)
                    _mm256_storeu_ps(to, r[l]);
                else
                    _mm256_maskstore_ps(to, first_lanes8(n), r[l]);
                continue;
            }
            uint8_t *to = (uint8_t *)arg + l * cells + c;
            if (whole) {
                /* each int32's low byte (no saturating pack: -1 is 255), 4 from each half */
                const __m256i low = _mm256_shuffle_epi8(
                    _mm256_castps_si256(r[l]),
                    _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                     0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                     -1));
                _mm_storel_epi64((__m128i *)to,
                                 _mm_unpacklo_epi32(_mm256_castsi256_si128(low),
                                                    _mm256_extracti128_si256(low, 1)));
                continue;
            }
            int32_t places[LANES];
            _mm256_storeu_ps((float *)places, r[l]);
            for (int k = 0; k < n; ++k)
                to[k] = (uint8_t)places[k];
        }
    }
}

/* Whether outputs (i, j) .. (i, j + 3) of a row have windows wholly inside the input */
static inline int four_inside(const window2d *g, int i, int j)
{
    const int r0 = i * g->sh - g->ph, c0 = j * g->sw - g->pw;
    return r0 >= 0 && r0 + g->kh <= g->h && c0 >= 0 && j + 4 <= g->ow &&
        c0 + 3 * g->sw + g->kw <= g->w;
}

/* Four outputs side by side in a row whose windows lie wholly inside the input (row r0,
 * columns c0, c0 + sw, ...): four independent chains of compares, as pool_lanes.c's. */
AVX2 static void max_lanes_four8(const float *t, const window2d *g, int r0, int c0,
                                 float *best_out, int32_t *at_out)
{
    __m256 best[4], at[4];
    for (int k = 0; k < 4; ++k) {
        best[k] = _mm256_set1_ps(-INFINITY);
        at[k] = place(0);
    }
    for (int u = 0; u < g->kh; ++u)
        for (int v = 0; v < g->kw; ++v) {
            const float *cell = t + ((size_t)(r0 + u) * g->w + c0 + v) * LANES;
            const __m256 tap = place(u * g->kw + v);
            for (int k = 0; k < 4; ++k) {
                const __m256 value = _mm256_load_ps(cell + (size_t)k * g->sw * LANES);
                MAX_TAP8(best[k], at[k], value, tap);
            }
        }
    for (int k = 0; k < 4; ++k) {
        _mm256_store_ps(best_out + k * LANES, best[k]);
        _mm256_store_ps((float *)(at_out + k * LANES), at[k]);
    }
}

/* Each output's maximum and winner (its place in the window, -1 for an empty window, whose
 * output is -FLT_MAX), for the 8 planes of t. */
AVX2 static void max_lanes8(const float *t, const window2d *g, float *best_out,
                            int32_t *at_out)
{
    for (int i = 0; i < g->oh; ++i)
        for (int j = 0; j < g->ow; ++j) {
            const int r0 = i * g->sh - g->ph, c0 = j * g->sw - g->pw;
            const size_t o = ((size_t)i * g->ow + j) * LANES;
            if (four_inside(g, i, j)) {
                max_lanes_four8(t, g, r0, c0, best_out + o, at_out + o);
                j += 3;
                continue;
            }
            int hs, he, ws, we;
            clip(g, i, j, &hs, &he, &ws, &we);
            const int empty = hs >= he || ws >= we;
            __m256 best = _mm256_set1_ps(-INFINITY);
            __m256 at = place(empty ? -1 : (hs - r0) * g->kw + ws - c0);
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v) {
                    const __m256 value = _mm256_load_ps(t + ((size_t)u * g->w + v) * LANES);
                    MAX_TAP8(best, at, value, place((u - r0) * g->kw + v - c0));
                }
            _mm256_store_ps(best_out + o, empty ? _mm256_set1_ps(-FLT_MAX) : best);
            _mm256_store_ps((float *)(at_out + o), at);
        }
}

/* Whether every window lies wholly inside the input: no padding, no overhang */
static int all_inside(const window2d *g)
{
    return g->ph == 0 && g->pw == 0 && (g->oh - 1) * g->sh + g->kh <= g->h &&
        (g->ow - 1) * g->sw + g->kw <= g->w;
}

/* The maxima and winners of n outputs (n <= 4) whose whole windows start at t + at[k]
 * (`pitch` cells a row): n independent chains of compares, as max_lanes_four8's. Inlined
 * with a constant n. */
AVX2 static inline __attribute__((always_inline)) void
max_windows8(const float *t, const int32_t *at, int n, int kh, int kw, int64_t pitch,
             float *best_out, int32_t *at_out)
{
    __m256 best[4], won[4];
    for (int k = 0; k < 4; ++k) {
        best[k] = _mm256_set1_ps(-INFINITY);
        won[k] = place(0);
    }
    for (int u = 0; u < kh; ++u)
        for (int v = 0; v < kw; ++v) {
            const float *cell = t + (u * pitch + v) * LANES;
            const __m256 tap = place(u * kw + v);
            for (int k = 0; k < 4; ++k)
                if (k < n) {
                    const __m256 value = _mm256_load_ps(cell + at[k]);
                    MAX_TAP8(best[k], won[k], value, tap);
                }
        }
    for (int k = 0; k < n; ++k) {
        _mm256_store_ps(best_out + k * LANES, best[k]);
        _mm256_store_ps((float *)(at_out + k * LANES), won[k]);
    }
}

/* Each output's maximum and winner where every window lies inside (`at`: each output's
 * window's first cell), 4 outputs at a time in row-major order, whatever their rows */
AVX2 static void max_inside8(const float *t, const int32_t *at, int64_t outputs,
                             const window2d *g, float *best, int32_t *won)
{
    int64_t o = 0;
    for (; o + 4 <= outputs; o += 4)
        max_windows8(t, at + o, 4, g->kh, g->kw, g->w, best + o * LANES, won + o * LANES);
    for (; o < outputs; ++o)
        max_windows8(t, at + o, 1, g->kh, g->kw, g->w, best + o * LANES, won + o * LANES);
}

/* AVE's planes are laid out with a border of zeros wide enough that every output's whole
 * window, padding and overhang included, lies inside: `cols` columns, the input's cell (r,
 * c) at (r + ph, c + pw). Adding the border's zeros leaves a sum from 0 the clipped window's
 * sum to the bit (x + 0 is x, and a sum from +0 is never -0), so every output adds all kh kw
 * taps, none is clipped, and any outputs may go side by side. */
typedef struct {
    int rows, cols;
} border8;

static border8 ave_border8(const window2d *g)
{
    const int rows = (g->oh - 1) * g->sh + g->kh, cols = (g->ow - 1) * g->sw + g->kw;
    border8 b = {rows > g->h + g->ph ? rows : g->h + g->ph,
                 cols > g->w + g->pw ? cols : g->w + g->pw};
    return b;
}

/* The sums of n outputs (n <= 8) whose windows start at t + at[k] in the bordered layout
 * (pitch: its columns): n independent chains of adds (one chain waited on each add: 3
 * cycles), each from 0 in its window's row-major order, over Caffe's sizes */
AVX2 static inline __attribute__((always_inline)) void
ave_sums8(const float *t, const int32_t *at, int n, int kh, int kw, int64_t pitch,
          const float *size, float *y)
{
    __m256 sum[8];
    for (int k = 0; k < 8; ++k)
        sum[k] = _mm256_setzero_ps();
    for (int u = 0; u < kh; ++u)
        for (int v = 0; v < kw; ++v) {
            const float *cell = t + (u * pitch + v) * LANES;
            for (int k = 0; k < 8; ++k)
                if (k < n)
                    sum[k] = _mm256_add_ps(sum[k], _mm256_load_ps(cell + at[k]));
        }
    for (int k = 0; k < n; ++k)
        _mm256_store_ps(y + k * LANES, _mm256_div_ps(sum[k], _mm256_set1_ps(size[k])));
}

/* Calls of ave_sums8 that ave_lanes8 makes for `outputs` outputs */
static inline int64_t sums_calls8(int64_t outputs)
{
    return outputs / 8 + outputs % 8 / 4 + outputs % 4;
}

/* Each output's window sum over Caffe's size (`size`), for the 8 planes of the bordered t
 * (`at`: each output's window's first cell), 8 outputs at a time in row-major order, asking
 * for some of `ahead` before each. Inlined: a NULL `ahead` leaves no fetching in the loop. */
AVX2 static inline __attribute__((always_inline)) void
ave_lanes8(const float *t, const int32_t *at, int64_t outputs, const window2d *g, int cols,
           const float *size, float *y, fetch_ahead *ahead)
{
    int64_t o = 0;
    for (; o + 8 <= outputs; o += 8) {
        if (ahead != NULL)
            fetch_some(ahead);
        ave_sums8(t, at + o, 8, g->kh, g->kw, cols, size + o, y + o * LANES);
    }
    for (; o + 4 <= outputs; o += 4) {
        if (ahead != NULL)
            fetch_some(ahead);
        ave_sums8(t, at + o, 4, g->kh, g->kw, cols, size + o, y + o * LANES);
    }
    for (; o < outputs; ++o) {
        if (ahead != NULL)
            fetch_some(ahead);
        ave_sums8(t, at + o, 1, g->kh, g->kw, cols, size + o, y + o * LANES);
    }
}

/* The next 8 planes (at x) on their way while these are compared or summed: AVE's forward of
 * GoogLeNet's auxiliary heads (14x14 -> 4x4), one thread on an EPYC, 1.6 -> 1.1 ms */
AVX2 static void prefetch_planes8(const float *x, int64_t cells)
{
    for (int64_t c = 0; c < LANES * cells; c += 16)
        _mm_prefetch((const char *)(x + c), _MM_HINT_T0);
}

/* Planes p .. p + count - 1 of x into t (gather_planes8), the next 8 on their way */
AVX2 static void take_planes8(const float *x, int64_t p, int64_t planes, int64_t cells,
                              int64_t count, float *t)
{
    gather_planes8(x + p * cells, cells, count, cells, t);
    if (p + 2 * LANES <= planes)
        prefetch_planes8(x + (p + LANES) * cells, cells);
}

/* Planes p .. p + count - 1 of x into the bordered t (`cols` columns), row by row; a layout
 * with no border is the planes' own, taken whole (with `burst`, the next 8 asked for at once
 * after, as take_planes8's). gather_planes8 from two places, so that the compiler inlines it
 * (called from a third, it did not: a global pooling's small planes ran 6-9% slower). */
AVX2 static void take_bordered8(const float *x, int64_t p, int64_t planes, const window2d *g,
                                border8 b, int64_t count, float *t, int burst)
{
    const int64_t cells = (int64_t)g->h * g->w;
    if (b.rows == g->h && b.cols == g->w)
        gather_planes8(x + p * cells, cells, count, cells, t);
    else
        for (int r = 0; r < g->h; ++r)
            gather_planes8(x + p * cells + (int64_t)r * g->w, cells, count, g->w,
                           t + ((int64_t)(r + g->ph) * b.cols + g->pw) * LANES);
    if (burst && p + 2 * LANES <= planes)
        prefetch_planes8(x + (p + LANES) * cells, cells);
}

/* The planes of the group of 8 from plane `first` on (fewer at the end) */
static inline int64_t group_size8(int64_t planes, int64_t first)
{
    return planes - first < LANES ? planes - first : LANES;
}

/* Up to `groups` groups of 8 planes from plane p on into t, side by side in b's layout (with
 * `burst` as take_bordered8's): how many groups there were */
AVX2 static inline int take_groups8(const float *x, int64_t p, int64_t planes,
                                    const window2d *g, border8 b, int groups, float *t,
                                    int burst)
{
    int taken = 0;
    for (; taken < groups && p + taken * LANES < planes; ++taken) {
        const int64_t first = p + taken * LANES;
        take_bordered8(x, first, planes, g, b, group_size8(planes, first),
                       t + taken * (int64_t)b.rows * b.cols * LANES, burst);
    }
    return taken;
}

/* Each output's window's first cell in t, for `groups` groups side by side in b's layout */
static void window_starts8(const window2d *g, border8 b, int groups, int32_t *at)
{
    const int64_t outputs = (int64_t)g->oh * g->ow;
    for (int q = 0; q < groups; ++q)
        for (int i = 0; i < g->oh; ++i)
            for (int j = 0; j < g->ow; ++j)
                at[q * outputs + i * g->ow + j] = (int32_t)(
                    ((int64_t)q * b.rows * b.cols + (int64_t)i * g->sh * b.cols + j * g->sw) *
                    LANES);
}

/* Groups of 8 planes taken at once: planes of fewer than 8 outputs several, so that 8
 * outputs' chains still run side by side */
static inline int groups_of8(int64_t outputs)
{
    return outputs >= LANES ? 1 : (int)(LANES / outputs);
}

/* 8 lanes for each of `cells` cells, aligned for whole-vector loads (free: _mm_free). */
static float *lane_buffer8(int64_t cells)
{
    return _mm_malloc(sizeof(float) * LANES * (size_t)(cells > 0 ? cells : 1), 32);
}

/* MAX where every window lies inside: no window is clipped, so any outputs go side by side
 * (max_inside8), and planes of fewer than 8 outputs several groups of 8 planes at once, side
 * by side in t (VGG's 4x4 pool5, 4 outputs a plane; AlexNet's 13x13 pool5, rows of 6) */
AVX2 static int lanes8_inside_forward(const float *x, float *y, void *arg, int arg_bytes,
                                      int64_t planes, const window2d *g)
{
    const int64_t cells = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    const int groups = groups_of8(outputs);
    const border8 plain = {g->h, g->w};
    float *t = lane_buffer8(cells * groups), *best = lane_buffer8(outputs * groups);
    int32_t *won = (int32_t *)lane_buffer8(outputs * groups);
    int32_t *at = malloc(sizeof(int32_t) * (size_t)(outputs * groups));
    if (t == NULL || best == NULL || won == NULL || at == NULL) {
        _mm_free(t);
        _mm_free(best);
        _mm_free(won);
        free(at);
        return -1;
    }
    window_starts8(g, plain, groups, at);
    for (int64_t p = 0; p < planes; p += (int64_t)LANES * groups) {
        const int taken = take_groups8(x, p, planes, g, plain, groups, t, 1);
        max_inside8(t, at, outputs * taken, g, best, won);
        for (int q = 0; q < taken; ++q) {
            const int64_t first = p + q * LANES, count = group_size8(planes, first);
            const int spill = (planes - first - count) * outputs >= LANES;
            spread_planes8(best + q * outputs * LANES, outputs, count, y + first * outputs,
                           spill);
            spread_winners8(won + q * outputs * LANES, outputs, count,
                            (char *)arg + first * outputs * arg_bytes, arg_bytes, spill);
        }
    }
    _mm_free(t);
    _mm_free(best);
    _mm_free(won);
    free(at);
    return 0;
}

AVX2 static int lanes8_forward(const float *x, float *y, void *arg, int arg_bytes,
                               int64_t planes, const window2d *g)
{
    if (all_inside(g))
        return lanes8_inside_forward(x, y, arg, arg_bytes, planes, g);
    const int64_t cells = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    float *t = lane_buffer8(cells), *best = lane_buffer8(outputs);
    int32_t *at = (int32_t *)lane_buffer8(outputs);
    if (t == NULL || best == NULL || at == NULL) {
        _mm_free(t);
        _mm_free(best);
        _mm_free(at);
        return -1;
    }
    for (int64_t p = 0; p < planes; p += LANES) {
        const int64_t count = planes - p < LANES ? planes - p : LANES;
        take_planes8(x, p, planes, cells, count, t);
        max_lanes8(t, g, best, at);
        const int spill = (planes - p - count) * outputs >= LANES;
        spread_planes8(best, outputs, count, y + p * outputs, spill);
        spread_winners8(at, outputs, count, (char *)arg + p * outputs * arg_bytes, arg_bytes,
                        spill);
    }
    _mm_free(t);
    _mm_free(best);
    _mm_free(at);
    return 0;
}

/* AVE in the bordered layout (ave_border8), planes of fewer than 8 outputs several groups of
 * 8 at once (GoogLeNet's 7x7 global pool5: one output a plane, one chain of 49 adds a group
 * of 8 planes) */
AVX2 static int lanes8_ave_forward(const float *x, float *y, const float *size, int64_t planes,
                                   const window2d *g)
{
    const int64_t outputs = (int64_t)g->oh * g->ow;
    const int groups = groups_of8(outputs);
    const border8 b = ave_border8(g);
    const int64_t bordered = (int64_t)b.rows * b.cols;
    float *t = lane_buffer8(bordered * groups), *sum = lane_buffer8(outputs * groups);
    int32_t *at = malloc(sizeof(int32_t) * (size_t)(outputs * groups));
    float *sizes = malloc(sizeof(float) * (size_t)(outputs * groups));
    if (t == NULL || sum == NULL || at == NULL || sizes == NULL) {
        _mm_free(t);
        _mm_free(sum);
        free(at);
        free(sizes);
        return -1;
    }
    memset(t, 0, sizeof(float) * LANES * (size_t)(bordered * groups));  /* borders stay 0 */
    window_starts8(g, b, groups, at);
    for (int64_t o = 0; o < outputs * groups; ++o)
        sizes[o] = size[o % outputs];
    const int64_t step = (int64_t)LANES * groups, cells = (int64_t)g->h * g->w;
    /* the next step's planes asked for a few lines at each call of the sums where there are
     * several (in the net's flow the input comes from memory, 8 planes' rows at a time: more
     * streams than the hardware's prefetcher follows); where there is one, a burst after each
     * group is taken */
    const int spread = sums_calls8(outputs * groups) >= 2;
    for (int64_t p = 0; p < planes; p += step) {
        const int taken = take_groups8(x, p, planes, g, b, groups, t, !spread);
        const int64_t next = spread && p + step < planes ? planes - p - step : 0;
        if (next > 0) {
            fetch_ahead ahead = fetch_region(x + (p + step) * cells,
                                             (next < step ? next : step) * cells,
                                             sums_calls8(outputs * taken));
            ave_lanes8(t, at, outputs * taken, g, b.cols, sizes, sum, &ahead);
        } else {
            ave_lanes8(t, at, outputs * taken, g, b.cols, sizes, sum, NULL);
        }
        for (int q = 0; q < taken; ++q) {
            const int64_t first = p + q * LANES, count = group_size8(planes, first);
            spread_planes8(sum + q * outputs * LANES, outputs, count, y + first * outputs,
                           (planes - first - count) * outputs >= LANES);
        }
    }
    _mm_free(t);
    _mm_free(sum);
    free(at);
    free(sizes);
    return 0;
}
#endif

/* MAX: y and arg (arg_bytes 1 or 4) as pool_max_forward's. */
int pool_lanes8_max_forward(const float *x, float *y, void *arg, int arg_bytes, int64_t planes,
                            int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                            int ph, int pw)
{
#if HAVE_AVX2
    if (!cpu_has_avx2() || (int64_t)h * w > LANE_CELLS || (arg_bytes != 1 && arg_bytes != 4))
        return -2;
    const window2d g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    return lanes8_forward(x, y, arg, arg_bytes, planes, &g);
#else
    (void)x, (void)y, (void)arg, (void)arg_bytes, (void)planes, (void)h, (void)w, (void)oh;
    (void)ow, (void)kh, (void)kw, (void)sh, (void)sw, (void)ph, (void)pw;
    return -2;
#endif
}

/* AVE: y as pool_ave_forward's; `size` holds Caffe's divisor of each output. */
int pool_lanes8_ave_forward(const float *x, float *y, const float *size, int64_t planes, int h,
                            int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                            int pw)
{
#if HAVE_AVX2
    if (!cpu_has_avx2() || (int64_t)h * w > LANE_CELLS)
        return -2;
    const window2d g = {h, w, oh, ow, kh, kw, sh, sw, ph, pw};
    return lanes8_ave_forward(x, y, size, planes, &g);
#else
    (void)x, (void)y, (void)size, (void)planes, (void)h, (void)w, (void)oh, (void)ow;
    (void)kh, (void)kw, (void)sh, (void)sw, (void)ph, (void)pw;
    return -2;
#endif
}
