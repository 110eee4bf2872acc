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
 * results. A 3x3 window costs 2 + 2 comparisons, not 8. The copy of the next plane is made
 * before this one's windows are taken, so that its stores have reached the cache when the
 * loads, straddling them, come (a load that straddles stores still in flight waits for them;
 * copying a row and reading it at once ran a third slower).
 *
 * Values are pooling.c's: a window's first input cell its winner until one is strictly
 * greater (-inf never is), the winner's place (row tap) * kw + column tap in a byte. A NaN
 * breaks the rows' rule (it becomes the maximum without moving the winner, and a row's
 * result cannot say where the cells before it won): a plane that holds one (the copy looks)
 * is taken window by window. Returns 0, -1 when out of memory, -2 where it does not serve
 * (no AVX2, winners of 4 bytes, another column stride, rows of few outputs, an empty window,
 * pool_rows_serve off).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "avx2.h"
#include "pool_window.h"

#define LANES 8
/* Rows of fewer outputs go to pool_lanes8.c: a vector mostly empty, the passes' starts cost
 * more than their work (AlexNet's 13x13 pool5, rows of 6: 2.1 ms here against 1.7 there;
 * VGG's 8x8 pool4, rows of 4: 1.8 against 0.8); rows of 7 still gain (GoogLeNet's 7x7
 * inception pools: 3.1 against 3.4) */
#define FEW_COLUMNS 7

/* 1 (the default): this pass serves wherever it can; 0: pooling.c goes on to pool_lanes8.c
 * (the tests take both) */
int pool_rows_serve = 1;

#if HAVE_AVX2
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

/* p[0], p[2], ..., p[14] */
AVX2 static inline __m256 evens(const float *p)
{
    const __m256 s = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + LANES),
                                       _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s),
                                                  _MM_SHUFFLE(3, 1, 2, 0)));
}

/* Padded input row u's windows: value[j], the first maximum of the row's taps in output
 * column j's window, tap[j] its place u * kw + column tap (an output row subtracts its
 * first row's r0 * kw once). Inlined with constant kw and sw. */
AVX2 static inline __attribute__((always_inline)) void
row_maxima(const rows_pass *q, const float *row, int u, float *value, int32_t *tap, int kw,
           int sw)
{
    const __m256i base = _mm256_set1_epi32(u * kw);
    for (int k = 0; k < q->vectors; ++k) {
        const float *p = row + (size_t)k * LANES * sw;
        /* tap 0 is the first inside, or padding (-inf) that the first inside replaces
         * only where greater: either way `first` is the winner so far */
        __m256 best = sw == 1 ? _mm256_loadu_ps(p) : evens(p);
        __m256 at = _mm256_castsi256_ps(_mm256_add_epi32(
            base, _mm256_load_si256((const __m256i *)(q->first + k * LANES))));
        for (int t = 1; t < kw; ++t) {
            const __m256 v = sw == 1 ? _mm256_loadu_ps(p + t) : evens(p + t);
            const __m256 greater = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
            best = _mm256_max_ps(v, best);          /* v where greater, else best: no NaN */
            at = _mm256_blendv_ps(at, _mm256_castsi256_ps(_mm256_set1_epi32(u * kw + t)),
                                  greater);
        }
        _mm256_store_ps(value + k * LANES, best);
        _mm256_store_ps((float *)(tap + k * LANES), at);
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
              int corner, float *y, int32_t *places, int spill)
{
    const size_t apart = q->result_row;
    const int ow = q->g.ow;
    for (int k = 0; k < q->vectors; ++k) {
        __m256 best = _mm256_load_ps(value + k * LANES);
        __m256 at = _mm256_load_ps((const float *)(tap + k * LANES));
        for (int a = 1; a < rows; ++a) {
            const __m256 v = _mm256_load_ps(value + a * apart + k * LANES);
            const __m256 greater = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
            best = _mm256_max_ps(v, best);
            at = _mm256_blendv_ps(
                at, _mm256_load_ps((const float *)(tap + a * apart + k * LANES)), greater);
        }
        _mm256_storeu_si256((__m256i *)(places + k * LANES),
                            _mm256_sub_epi32(_mm256_castps_si256(at),
                                             _mm256_set1_epi32(corner)));
        const int n = ow - k * LANES;
        if (n >= LANES || spill) {
            _mm256_storeu_ps(y + k * LANES, best);
        } else {
            float values[LANES];
            _mm256_storeu_ps(values, best);
            memcpy(y + k * LANES, values, sizeof(float) * (size_t)n);
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

/* Every plane; inlined with constant kh, kw and sw for the common windows. */
AVX2 static inline __attribute__((always_inline)) void
max_planes(const rows_pass *q, const float *x, float *y, uint8_t *arg, int64_t planes,
           int kh, int kw, int sw)
{
    const window2d *g = &q->g;
    const int64_t cells = (int64_t)g->h * g->w, outputs = (int64_t)g->oh * g->ow;
    int nan_next = pad_plane(q, x, q->padded[0]);
    for (int64_t p = 0; p < planes; ++p) {
        const float *padded = q->padded[p & 1];
        float *yp = y + p * outputs;
        uint8_t *ap = arg + p * outputs;
        const int nan = nan_next;
        if (p + 1 < planes)
            nan_next = pad_plane(q, x + (p + 1) * cells, q->padded[(p + 1) & 1]);
        if (nan) {
            max_plane_by_windows(x + p * cells, yp, ap, g);
            continue;
        }
        for (int u = 0; u < g->h; ++u)
            row_maxima(q, padded + (size_t)u * q->pitch, u, q->value + u * q->result_row,
                       q->tap + u * q->result_row, kw, sw);
        for (int i = 0; i < g->oh; ++i) {
            const int r0 = i * g->sh - g->ph;
            const int a0 = r0 < 0 ? -r0 : 0, a1 = r0 + kh > g->h ? g->h - r0 : kh;
            const size_t first = (size_t)(r0 + a0) * q->result_row;
            float *yr = yp + (size_t)i * g->ow;
            int32_t *ar = q->places + (size_t)i * g->ow;
            /* the outputs after this row (stored later), enough for a whole vector */
            const int spill = (planes - 1 - p) * outputs + (int64_t)(g->oh - 1 - i) * g->ow >=
                LANES;
            if (a1 - a0 == kh)
                column_maxima(q, q->value + first, q->tap + first, kh, r0 * kw, yr, ar, spill);
            else
                column_maxima(q, q->value + first, q->tap + first, a1 - a0, r0 * kw, yr, ar,
                              spill);
        }
        narrow_places(q->places, ap, outputs);
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
    rows_pass q = {*g, vectors, whole > reach ? whole : reach, {NULL, NULL}, NULL, NULL, NULL,
                   NULL, (size_t)vectors * LANES};
    const size_t plane = q.pitch * g->h;
    q.padded[0] = _mm_malloc(sizeof(float) * plane * 2, 32);
    q.padded[1] = q.padded[0] + plane;
    q.first = _mm_malloc(sizeof(int32_t) * q.result_row, 32);
    q.value = _mm_malloc(sizeof(float) * q.result_row * g->h, 32);
    q.tap = _mm_malloc(sizeof(int32_t) * q.result_row * g->h, 32);
    q.places = _mm_malloc(sizeof(int32_t) * ((size_t)g->oh * g->ow + LANES), 32);
    int status = -1;
    if (q.padded[0] != NULL && q.first != NULL && q.value != NULL && q.tap != NULL &&
        q.places != NULL) {
        for (size_t c = 0; c < plane * 2; ++c)
            q.padded[0][c] = -INFINITY;
        for (size_t j = 0; j < q.result_row; ++j) {
            const int c0 = (int)j * g->sw - g->pw;
            q.first[j] = c0 < 0 && (int)j < g->ow ? -c0 : 0;
        }
        if (g->kh == 3 && g->kw == 3 && g->sw == 1)
            max_planes(&q, x, y, arg, planes, 3, 3, 1);
        else if (g->kh == 3 && g->kw == 3 && g->sw == 2)
            max_planes(&q, x, y, arg, planes, 3, 3, 2);
        else if (g->kh == 2 && g->kw == 2 && g->sw == 2)
            max_planes(&q, x, y, arg, planes, 2, 2, 2);
        else if (g->sw == 1)
            max_planes(&q, x, y, arg, planes, g->kh, g->kw, 1);
        else
            max_planes(&q, x, y, arg, planes, g->kh, g->kw, 2);
        status = 0;
    }
    _mm_free(q.padded[0]);
    _mm_free(q.first);
    _mm_free(q.value);
    _mm_free(q.tap);
    _mm_free(q.places);
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
