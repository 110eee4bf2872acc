/* Caffe's im2col and col2im for 2-D convolution, in either layout of conv.py:
 *
 *     col[(c, a, t), (n, i, j)] = x[n, c, i * sh + a * dh - ph, j * sw + t * dw - pw]
 *
 * (0 outside x): channel-major, a (C * kh * kw) x (N * oh * ow) float32 matrix, or image by
 * image, (N, rows >= C * kh * kw, oh * ow); a column row (c, a, t) of image n starts at
 * row * row_pitch + n * image_pitch. And its adjoint, which sums every tap's column back into
 * x's shape. numpy makes the columns as one strided copy of a
 * padded channel-major copy of x, and the adjoint as kh * kw strided adds over a padded
 * buffer; each is a pass of short strided rows (LeNet's 8 outputs wide) that runs at a tenth
 * of the memory's rate. Here a column row is made from x directly, a row of outputs at a time
 * (contiguous for stride 1, a vector loop of every second cell for stride 2), and the adjoint
 * adds a plane's taps in one plane-sized buffer that stays in cache. The adjoint adds the taps
 * in numpy's order, (a, t) row-major, starting from 0: the same sums, bit for bit.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_loop.h"

typedef struct {
    int64_t n;
    int c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
} geometry;

/* where image n's cells of column row `row` start */
static inline size_t column_at(int64_t row, int64_t n, int64_t row_pitch, int64_t image_pitch)
{
    return (size_t)(row * row_pitch + n * image_pitch);
}

/* to[j * step] += from[j] for j < count: stride 1 on vectors. */
VECTOR_LOOP
static void add_row(float *restrict to, const float *restrict from, int count)
{
    for (int j = 0; j < count; ++j)
        to[j] += from[j];
}

/* The outputs j of a row whose tap column j * sw + off lies in [0, w): [*lo, *hi). */
static void inside(int off, int step, int w, int ow, int *lo, int *hi)
{
    /* j * step + off >= 0  and  j * step + off <= w - 1 */
    int first = off >= 0 ? 0 : (-off + step - 1) / step;
    int last = w - 1 - off < 0 ? -1 : (w - 1 - off) / step;
    if (last > ow - 1)
        last = ow - 1;
    *lo = first;
    *hi = last + 1 > first ? last + 1 : first;
}

/* The oh x ow cells of one column row that one plane xp gives: x's row i * sh + a * dh - ph
 * (zeros past the input), its cells j * sw + off for j in [lo, hi), zeros outside. One call a
 * plane, its rows in loops the compiler runs on vectors. */
VECTOR_LOOP
static void plane_cells(const geometry *g, const float *restrict xp, int a, int off, int lo,
                        int hi, float *restrict to)
{
    int ow = g->ow, sw = g->sw;
    for (int i = 0; i < g->oh; ++i, to += ow) {
        int u = i * g->sh + a * g->dh - g->ph;
        if (u < 0 || u >= g->h) {
            for (int j = 0; j < ow; ++j)
                to[j] = 0.0f;
            continue;
        }
        const float *restrict row = xp + (size_t)u * g->w + off;
        for (int j = 0; j < lo; ++j)
            to[j] = 0.0f;
        if (sw == 1) {
#pragma GCC ivdep
            for (int j = lo; j < hi; ++j)
                to[j] = row[j];
        } else if (sw == 2) {
#pragma GCC ivdep
            for (int j = lo; j < hi; ++j)
                to[j] = row[2 * j];
        } else {
            for (int j = lo; j < hi; ++j)
                to[j] = row[j * sw];
        }
        for (int j = hi; j < ow; ++j)
            to[j] = 0.0f;
    }
}

static int make_geometry(geometry *g, int64_t n, int c, int h, int w, int oh, int ow, int kh,
                         int kw, int sh, int sw, int ph, int pw, int dh, int dw)
{
    geometry v = {n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw};
    *g = v;
    return n >= 0 && c > 0 && h > 0 && w > 0 && oh > 0 && ow > 0 && kh > 0 && kw > 0 &&
        sh > 0 && sw > 0 && dh > 0 && dw > 0 ? 0 : -2;
}

/* col ((c * kh + a) * kw + t, (n * oh + i) * ow + j) = the cell of x (N, C, h, w) that tap
 * (a, t) of output (i, j) reads, 0 past the input. -2: a geometry out of range. */
int im2col_2d(const float *restrict x, float *restrict col, int64_t row_pitch,
              int64_t image_pitch, int64_t n, int c, int h, int w, int oh, int ow, int kh,
              int kw, int sh, int sw, int ph, int pw, int dh, int dw)
{
    geometry g;
    if (make_geometry(&g, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw))
        return -2;
    size_t plane = (size_t)h * w;
    for (int cc = 0; cc < c; ++cc)
        for (int a = 0; a < kh; ++a)
            for (int t = 0; t < kw; ++t) {
                int64_t row = ((int64_t)cc * kh + a) * kw + t;
                int off = t * dw - pw, lo, hi;
                inside(off, sw, w, ow, &lo, &hi);
                for (int64_t nn = 0; nn < n; ++nn)
                    plane_cells(&g, x + ((size_t)nn * c + cc) * plane, a, off, lo, hi,
                                col + column_at(row, nn, row_pitch, image_pitch));
            }
    return 0;
}

/* dx (N, C, h, w) = the sum over taps of each column cell put back where im2col_2d took it
 * from; the taps of a plane are added, in (a, t) order from 0, in a buffer of the padded
 * plane. -1: out of memory; -2: a geometry out of range. */
int col2im_2d(const float *restrict col, float *restrict dx, int64_t row_pitch,
              int64_t image_pitch, int64_t n, int c, int h, int w, int oh, int ow, int kh,
              int kw, int sh, int sw, int ph, int pw, int dh, int dw)
{
    geometry g;
    if (make_geometry(&g, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw))
        return -2;
    /* the padded extent reaches every tap of every output */
    int hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
    if (hp < h + ph)
        hp = h + ph;
    if (wp < w + pw)
        wp = w + pw;
    float *pad = malloc(sizeof(float) * (size_t)hp * wp);
    if (pad == NULL)
        return -1;
    for (int64_t nn = 0; nn < n; ++nn)
        for (int cc = 0; cc < c; ++cc) {
            memset(pad, 0, sizeof(float) * (size_t)hp * wp);
            for (int a = 0; a < kh; ++a)
                for (int t = 0; t < kw; ++t) {
                    const float *from = col + column_at(((int64_t)cc * kh + a) * kw + t, nn,
                                                        row_pitch, image_pitch);
                    for (int i = 0; i < oh; ++i) {
                        float *to = pad + (size_t)(i * sh + a * dh) * wp + t * dw;
                        const float *src = from + (size_t)i * ow;
                        if (sw == 1)
                            add_row(to, src, ow);
                        else
                            for (int j = 0; j < ow; ++j)
                                to[j * sw] += src[j];
                    }
                }
            float *plane = dx + ((size_t)nn * c + cc) * (size_t)h * w;
            for (int u = 0; u < h; ++u)
                memcpy(plane + (size_t)u * w, pad + (size_t)(u + ph) * wp + pw,
                       sizeof(float) * (size_t)w);
        }
    free(pad);
    return 0;
}
