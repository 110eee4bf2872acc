/* Compiled passes for the CPU backend, where numpy would need several strided passes or
 * copies: 2-D MAX and AVE pooling, forward and backward, over planes of (height, width).
 *
 * Built at install as the extension module poseidon_caffe.backend._kernels (optional:
 * without a compiler the numpy paths run). The module itself is empty; native.py calls the
 * functions below through ctypes, which releases the GIL, so the batch parts of split.py run
 * side by side. The functions only read and write the C-contiguous float32 arrays they are
 * handed.
 *
 * The window rules are Caffe's (pooling_layer.cpp): MAX ignores padding and an empty window
 * gives -FLT_MAX and no winner; AVE sums the window clipped to the input and divides by its
 * size clipped to input + padding, in Caffe's order of summation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_loop.h"

/* The version of the functions' signatures below and in lrn.c, direct.c and winograd.c
 * (raise it with any change to one); native.py refuses a library built from another version
 * (an in-place build older than this source). */
int kernels_version(void)
{
    return 6;
}

/* One axis of a pooling: where output o's window starts and ends, clipped to the input. */
static void window(int o, int stride, int pad, int kernel, int size, int *start, int *end)
{
    int s = o * stride - pad;
    int e = s + kernel;
    *start = s < 0 ? 0 : s;
    *end = e > size ? size : e;
}

/* For n cells: where g[q] is greater than best[q], it becomes best[q] and at[q] becomes t;
 * a NaN becomes best[q] (and stays: no value is greater than NaN) but does not move at[q].
 * Masks, not branches, so the loop runs on vectors (kept a call of its own: inlined into
 * the pass, the compiler loses the restrict promises and runs the loop a cell at a time). */
VECTOR_LOOP
static void take_greater_tap(const float *restrict g, int32_t t, int n,
                                    float *restrict best, int32_t *restrict at)
{
    for (int q = 0; q < n; ++q) {
        float value = g[q];
        int32_t greater = -(int32_t)(value > best[q]);
        best[q] = (value > best[q]) | (value != value) ? value : best[q];
        at[q] = (at[q] & ~greater) | (t & greater);
    }
}

/* Winners are kept as their place inside the window, (row tap) * kw + column tap, counted
 * from the window's corner in the padded input: one byte each where the window has at most
 * 255 cells (255: no winner), else int32 (-1: no winner). A flat index would need int32
 * whatever the window, four times the memory of the outputs' byte each. */
#define NO_WINNER_BYTE 255

/* to = the low byte of each from: a place, or -1 -> NO_WINNER_BYTE */
static inline void narrow(const int32_t *restrict from, size_t n, uint8_t *restrict to)
{
    for (size_t q = 0; q < n; ++q)
        to[q] = (uint8_t)from[q];
}

/* The layout every pooling pass below works in: a plane, padded, split by phase. Padded row
 * u + ph = kk * sh + rr and padded column v + pw = k * sw + r go to block (rr, r), row kk,
 * column k; a block has `rows` = oh + (kh - 1) / sh rows of `cols` = ow + (kw - 1) / sw
 * columns. Then window tap (a, t) of output (i, j) lies at row i + a / sh, column j + t / sw
 * of block (a % sh, t % sw): for one tap the cells of all outputs are one block read with the
 * outputs' row pitch `cols`, so a tap is a single contiguous loop over the whole plane (the
 * columns j >= ow it also computes are dropped). Cells outside the input keep the fill value
 * they were given once per call (0 for AVE, -inf for MAX), which cannot change a sum or a
 * strict maximum; input cells no window reads are not stored. */
typedef struct {
    int rows, cols, sh, sw, ph, pw, h, w;
    size_t block;               /* rows * cols */
    size_t size;                /* all blocks, plus a row of slack the last taps read past */
    int *lo, *hi;               /* per column phase r: the block columns that hold input */
} phased;

static int phased_init(phased *q, int h, int w, int oh, int ow, int kh, int kw, int sh,
                       int sw, int ph, int pw)
{
    q->rows = oh + (kh - 1) / sh;
    q->cols = ow + (kw - 1) / sw;
    q->sh = sh;
    q->sw = sw;
    q->ph = ph;
    q->pw = pw;
    q->h = h;
    q->w = w;
    q->block = (size_t)q->rows * q->cols;
    q->size = (size_t)sh * sw * q->block + q->cols;
    q->lo = malloc(sizeof(int) * (size_t)sw);
    q->hi = malloc(sizeof(int) * (size_t)sw);
    if (q->lo == NULL || q->hi == NULL) {
        free(q->lo);
        free(q->hi);
        return -1;
    }
    for (int r = 0; r < sw; ++r) {
        /* 0 <= k * sw + r - pw <= w - 1, and k < cols */
        int first = pw - r;
        int lo = first <= 0 ? 0 : (first + sw - 1) / sw;
        int last = w - 1 + pw - r;
        int hi = last < 0 ? 0 : last / sw + 1;
        q->lo[r] = lo;
        q->hi[r] = hi < q->cols ? hi : q->cols;
        if (q->hi[r] < lo)
            q->hi[r] = lo;
    }
    return 0;
}

static void phased_free(phased *q)
{
    free(q->lo);
    free(q->hi);
}

/* The first cell of block (rr, r), row kk. */
static inline float *phased_row(const phased *q, float *base, int rr, int r, int kk)
{
    return base + ((size_t)rr * q->sw + r) * q->block + (size_t)kk * q->cols;
}

/* Where tap (a, t) of output (0, 0) lies: output (i, j)'s cell is i * cols + j past it. */
static inline size_t phased_tap(const phased *q, int a, int t)
{
    return ((size_t)(a % q->sh) * q->sw + t % q->sw) * q->block +
        (size_t)(a / q->sh) * q->cols + t / q->sw;
}

/* One plane of x into the layout (its input cells only). */
static void phased_fill(const phased *q, const float *restrict xp, float *restrict base)
{
    for (int u = 0; u < q->h; ++u) {
        int kk = (u + q->ph) / q->sh;
        if (kk >= q->rows)
            break;
        const float *row = xp + (size_t)u * q->w - q->pw;
        for (int r = 0; r < q->sw; ++r) {
            float *to = phased_row(q, base, (u + q->ph) % q->sh, r, kk);
            for (int k = q->lo[r]; k < q->hi[r]; ++k)
                to[k] = row[k * q->sw + r];
        }
    }
}

/* The other way: each input cell of one plane from the layout, 0 for a cell no window reads
 * (a row past the blocks' rows, columns past their columns). */
static void phased_take(const phased *q, const float *restrict base, float *restrict xp)
{
    int covered = q->cols * q->sw - q->pw;
    if (covered > q->w)
        covered = q->w;
    if (covered < 0)
        covered = 0;
    for (int u = 0; u < q->h; ++u) {
        int kk = (u + q->ph) / q->sh;
        float *row = xp + (size_t)u * q->w;
        if (kk >= q->rows) {
            memset(row, 0, sizeof(float) * (size_t)q->w);
            continue;
        }
        for (int r = 0; r < q->sw; ++r) {
            const float *from = phased_row(q, (float *)base, (u + q->ph) % q->sh, r, kk);
            float *to = row - q->pw + r;
            for (int k = q->lo[r]; k < q->hi[r]; ++k)
                to[k * q->sw] = from[k];
        }
        memset(row + covered, 0, sizeof(float) * (size_t)(q->w - covered));
    }
}

/* to += from over n cells (a call of its own, as take_greater_tap). */
VECTOR_LOOP
static void add_into(float *restrict to, const float *restrict from, size_t n)
{
    for (size_t q = 0; q < n; ++q)
        to[q] += from[q];
}

static inline void fill_floats(float *to, float value, size_t n)
{
    for (size_t q = 0; q < n; ++q)
        to[q] = value;
}

/* Below this many outputs a plane (a global pooling's one) the taps' loops are too short to
 * pay for the layout: each window is visited directly, in Caffe's loop order. */
#define FEW_OUTPUTS 16

static void max_direct(const float *restrict xp, float *restrict yp, int32_t *restrict at,
                       int h, int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                       int pw)
{
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < ow; ++j) {
            int ws, we;
            window(j, sw, pw, kw, w, &ws, &we);
            float best = -INFINITY;
            int32_t place = hs < he && ws < we ?
                (hs - (i * sh - ph)) * kw + ws - (j * sw - pw) : -1;
            for (int u = hs; u < he; ++u) {
                for (int v = ws; v < we; ++v) {
                    float value = xp[u * w + v];
                    if (value > best)
                        place = (u - (i * sh - ph)) * kw + v - (j * sw - pw);
                    best = (value > best) | (value != value) ? value : best;
                }
            }
            yp[i * ow + j] = place < 0 ? -FLT_MAX : best;
            at[i * ow + j] = place;
        }
    }
}

static void ave_direct(const float *restrict xp, float *restrict yp, const float *size, int h,
                       int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < ow; ++j) {
            int ws, we;
            window(j, sw, pw, kw, w, &ws, &we);
            float sum = 0.0f;
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v)
                    sum += xp[u * w + v];
            yp[i * ow + j] = sum / size[i * ow + j];
        }
    }
}

static void ave_direct_backward(const float *restrict dyp, float *restrict dxp,
                                const float *size, int h, int w, int oh, int ow, int kh,
                                int kw, int sh, int sw, int ph, int pw)
{
    memset(dxp, 0, sizeof(float) * (size_t)h * w);
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < ow; ++j) {
            int ws, we;
            window(j, sw, pw, kw, w, &ws, &we);
            float share = dyp[i * ow + j] / size[i * ow + j];
            for (int u = hs; u < he; ++u)
                for (int v = ws; v < we; ++v)
                    dxp[u * w + v] += share;
        }
    }
}

/* y = the maximum of each window; arg = the place in its window (see above) of the first
 * maximum in row-major order (a later cell takes over only when strictly greater), no winner
 * for an empty window; arg_bytes: 1 or 4, arg's element size. A NaN in a window makes its
 * output NaN, as numpy's maximum does.
 *
 * Which cell wins is data, which a branch predictor cannot learn, so the comparisons are
 * masks over whole planes: in the phased layout (above, padding -inf) the taps are visited
 * in the window's row-major order, each one contiguous loop over every output of the plane.
 * Each output starts at -inf with its window's first input cell as winner, so a window of
 * -inf keeps that cell, as Caffe's loop keeps its first. -1: out of memory. */
int pool_max_forward(const float *restrict x, float *restrict y, void *restrict arg,
                     int arg_bytes, int64_t planes, int h, int w, int oh, int ow, int kh,
                     int kw, int sh, int sw, int ph, int pw)
{
    phased q;
    if (phased_init(&q, h, w, oh, ow, kh, kw, sh, sw, ph, pw) < 0)
        return -1;
    size_t padded = (size_t)oh * q.cols, outputs = (size_t)oh * ow;
    float *base = malloc(sizeof(float) * q.size);
    float *best = malloc(sizeof(float) * padded);
    int32_t *at = malloc(sizeof(int32_t) * padded);
    int32_t *first = malloc(sizeof(int32_t) * padded);   /* each window's first cell, -1 */
    if (base == NULL || best == NULL || at == NULL || first == NULL) {
        free(base);
        free(best);
        free(at);
        free(first);
        phased_free(&q);
        return -1;
    }
    fill_floats(base, -INFINITY, q.size);
    for (int i = 0; i < oh; ++i) {
        int hs, he;
        window(i, sh, ph, kh, h, &hs, &he);
        for (int j = 0; j < q.cols; ++j) {
            int ws = 0, we = 0;
            if (j < ow)
                window(j, sw, pw, kw, w, &ws, &we);
            first[i * q.cols + j] = hs < he && ws < we ?
                (hs - (i * sh - ph)) * kw + ws - (j * sw - pw) : -1;
        }
    }
    for (int64_t p = 0; p < planes; ++p) {
        float *yp = y + p * (int64_t)outputs;
        if (outputs < FEW_OUTPUTS) {
            max_direct(x + p * (int64_t)h * w, yp, at, h, w, oh, ow, kh, kw, sh, sw, ph, pw);
            if (arg_bytes == 1)
                narrow(at, outputs, (uint8_t *)arg + (size_t)p * outputs);
            else
                memcpy((int32_t *)arg + (size_t)p * outputs, at, sizeof(int32_t) * outputs);
            continue;
        }
        phased_fill(&q, x + p * (int64_t)h * w, base);
        fill_floats(best, -INFINITY, padded);
        memcpy(at, first, sizeof(int32_t) * padded);
        for (int a = 0; a < kh; ++a)
            for (int t = 0; t < kw; ++t)
                take_greater_tap(base + phased_tap(&q, a, t), a * kw + t, (int)padded, best,
                                 at);
        for (int i = 0; i < oh; ++i) {
            const int32_t *fr = first + (size_t)i * q.cols;
            const float *br = best + (size_t)i * q.cols;
            int32_t *ar = at + (size_t)i * q.cols;
            float *yr = yp + (size_t)i * ow;
            for (int j = 0; j < ow; ++j) {
                yr[j] = fr[j] < 0 ? -FLT_MAX : br[j];
                ar[j] = fr[j] < 0 ? -1 : ar[j];
            }
            /* places are 0..254 and -1 (no winner) keeps its low byte, 255 */
            if (arg_bytes == 1)
                narrow(ar, (size_t)ow, (uint8_t *)arg + (size_t)p * outputs + (size_t)i * ow);
            else
                memcpy((int32_t *)arg + (size_t)p * outputs + (size_t)i * ow, ar,
                       sizeof(int32_t) * (size_t)ow);
        }
    }
    free(base);
    free(best);
    free(at);
    free(first);
    phased_free(&q);
    return 0;
}

/* dx of one plane: each dy added at its window's winner, in the outputs' order. Inlined with
 * a constant arg_bytes, so each element size gets its own loop. */
static inline void route_plane(const float *restrict dy, const void *restrict arg,
                               int arg_bytes, float *restrict dx, const int32_t *restrict cell,
                               int w, int oh, int ow, int sh, int sw, int ph, int pw)
{
    const uint8_t *a1 = arg;
    const int32_t *a4 = arg;
    for (int i = 0; i < oh; ++i) {
        int64_t corner = (int64_t)(i * sh - ph) * w - pw;     /* of window (i, 0) */
        for (int j = 0; j < ow; ++j, corner += sw) {
            int32_t place = arg_bytes == 1 ? a1[j] : a4[j];
            if (arg_bytes == 1 ? place != NO_WINNER_BYTE : place >= 0)
                dx[corner + cell[place]] += dy[j];
        }
        a1 += ow;
        a4 += ow;
        dy += ow;
    }
}

/* dx = each dy added at its window's winner (arg from pool_max_forward, arg_bytes its element
 * size): the window's corner plus the offset of the winner's place in the input. -1: out of
 * memory. */
int pool_max_backward(const float *restrict dy, const void *restrict arg, int arg_bytes,
                      float *restrict dx, int64_t planes, int h, int w, int oh, int ow,
                      int kh, int kw, int sh, int sw, int ph, int pw)
{
    int32_t *cell = malloc(sizeof(int32_t) * (size_t)kh * kw);   /* place -> offset */
    if (cell == NULL)
        return -1;
    for (int a = 0; a < kh; ++a)
        for (int b = 0; b < kw; ++b)
            cell[a * kw + b] = a * w + b;
    memset(dx, 0, sizeof(float) * (size_t)(planes * h * w));
    int64_t out_count = (int64_t)oh * ow;
    for (int64_t p = 0; p < planes; ++p) {
        const float *dyp = dy + p * out_count;
        float *dxp = dx + p * (int64_t)h * w;
        if (arg_bytes == 1)
            route_plane(dyp, (const uint8_t *)arg + p * out_count, 1, dxp, cell, w, oh, ow,
                        sh, sw, ph, pw);
        else
            route_plane(dyp, (const int32_t *)arg + p * out_count, 4, dxp, cell, w, oh, ow,
                        sh, sw, ph, pw);
    }
    free(cell);
    return 0;
}

/* Caffe's AVE divisor on one axis: the window clipped to input + padding, before clipping to
 * the input. */
static int padded_extent(int o, int stride, int pad, int kernel, int size)
{
    int s = o * stride - pad;
    int e = s + kernel;
    if (e > size + pad)
        e = size + pad;
    return e - s;
}

/* Caffe's divisor of every output, as float (int products, converted as Caffe's /= does). */
static float *ave_divisors(int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                           int ph, int pw)
{
    float *size = malloc(sizeof(float) * (size_t)oh * ow);
    if (size == NULL)
        return NULL;
    for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j)
            size[i * ow + j] = (float)(padded_extent(i, sh, ph, kh, h) *
                                       padded_extent(j, sw, pw, kw, w));
    return size;
}

/* y = the window sum divided by Caffe's window size. In the phased layout (padding 0) the
 * taps are added in the window's row-major order, each one contiguous loop over every output
 * of the plane: each output gets Caffe's float32 sum in Caffe's order (adding 0 changes no
 * sum). -1: out of memory. */
int pool_ave_forward(const float *restrict x, float *restrict y, int64_t planes, int h,
                     int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    phased q;
    if (phased_init(&q, h, w, oh, ow, kh, kw, sh, sw, ph, pw) < 0)
        return -1;
    size_t padded = (size_t)oh * q.cols;
    float *base = calloc(q.size, sizeof(float));
    float *sum = malloc(sizeof(float) * padded);
    float *size = ave_divisors(h, w, oh, ow, kh, kw, sh, sw, ph, pw);
    if (base == NULL || sum == NULL || size == NULL) {
        free(base);
        free(sum);
        free(size);
        phased_free(&q);
        return -1;
    }
    for (int64_t p = 0; p < planes; ++p) {
        float *yp = y + p * (int64_t)oh * ow;
        if ((size_t)oh * ow < FEW_OUTPUTS) {
            ave_direct(x + p * (int64_t)h * w, yp, size, h, w, oh, ow, kh, kw, sh, sw, ph, pw);
            continue;
        }
        phased_fill(&q, x + p * (int64_t)h * w, base);
        memset(sum, 0, sizeof(float) * padded);
        for (int a = 0; a < kh; ++a)
            for (int t = 0; t < kw; ++t)
                add_into(sum, base + phased_tap(&q, a, t), padded);
        for (int i = 0; i < oh; ++i)
            for (int j = 0; j < ow; ++j)
                yp[i * ow + j] = sum[(size_t)i * q.cols + j] / size[i * ow + j];
    }
    free(base);
    free(sum);
    free(size);
    phased_free(&q);
    return 0;
}

/* dx = each dy divided by its window's size, added over the window's cells. The shares go
 * into the phased layout a tap at a time, taps last to first: a cell then gets its windows'
 * shares in the windows' row-major order, the order of Caffe's loop over the outputs. -1:
 * out of memory. */
int pool_ave_backward(const float *restrict dy, float *restrict dx, int64_t planes, int h,
                      int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    phased q;
    if (phased_init(&q, h, w, oh, ow, kh, kw, sh, sw, ph, pw) < 0)
        return -1;
    size_t padded = (size_t)oh * q.cols;
    float *base = malloc(sizeof(float) * q.size);
    float *share = calloc(padded, sizeof(float));        /* columns j >= ow stay 0 */
    float *size = ave_divisors(h, w, oh, ow, kh, kw, sh, sw, ph, pw);
    if (base == NULL || share == NULL || size == NULL) {
        free(base);
        free(share);
        free(size);
        phased_free(&q);
        return -1;
    }
    for (int64_t p = 0; p < planes; ++p) {
        const float *dyp = dy + p * (int64_t)oh * ow;
        if ((size_t)oh * ow < FEW_OUTPUTS) {
            ave_direct_backward(dyp, dx + p * (int64_t)h * w, size, h, w, oh, ow, kh, kw, sh,
                                sw, ph, pw);
            continue;
        }
        for (int i = 0; i < oh; ++i)
            for (int j = 0; j < ow; ++j)
                share[(size_t)i * q.cols + j] = dyp[i * ow + j] / size[i * ow + j];
        memset(base, 0, sizeof(float) * q.size);
        for (int a = kh - 1; a >= 0; --a)
            for (int t = kw - 1; t >= 0; --t)
                add_into(base + phased_tap(&q, a, t), share, padded);
        phased_take(&q, base, dx + p * (int64_t)h * w);
    }
    free(base);
    free(share);
    free(size);
    phased_free(&q);
    return 0;
}

/* An importable module, so that the import system finds the library (editable installs
 * included); it has no Python functions of its own. */
static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_kernels", "Pooling passes called through ctypes (native.py).",
    -1, NULL, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&kernels_module);
}
