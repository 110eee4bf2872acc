/* Compiled local response normalisation across channels (lrn.py), Caffe's formulas:
 *
 *     scale = k + alpha/size * sum of x^2 over the size channels centred on c (zero past
 *             the ends),  top = x * scale^-beta,
 *     dx    = dy * scale^-beta - 2 alpha beta/size * x * sum over the same window of
 *             dy * top / scale.
 *
 * numpy makes these as a dozen whole-array passes (squares, shifted adds, powers, products);
 * here each image is one pass over its planes, the window's planes read from cache, every
 * loop running over the positions of a plane on vectors. The scale need not be kept from
 * forward to backward: the backward remakes it from x, an image at a time. Arrays are
 * C-contiguous float32 (n, channels, positions).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* scale^-beta, with the square-root forms of Caffe's usual betas */
static void negative_power(const float *restrict s, float *restrict out, int64_t count,
                           float beta)
{
    if (beta == 0.75f) {
        for (int64_t p = 0; p < count; ++p) {
            const float r = sqrtf(s[p]);
            out[p] = 1.0f / (r * sqrtf(r));
        }
    } else if (beta == 0.5f) {
        for (int64_t p = 0; p < count; ++p)
            out[p] = 1.0f / sqrtf(s[p]);
    } else {
        for (int64_t p = 0; p < count; ++p)
            out[p] = powf(s[p], -beta);
    }
}

/* scale of channel c of one image: k + alpha/size * the window's sum of squares */
static void window_scale(const float *restrict xi, float *restrict sc, int c, int channels,
                         int64_t positions, int size, float coef, float k)
{
    const int half = (size - 1) / 2;
    const int lo = c - half < 0 ? 0 : c - half;
    const int hi = c + half >= channels ? channels - 1 : c + half;
    for (int64_t p = 0; p < positions; ++p)
        sc[p] = 0.0f;
    for (int d = lo; d <= hi; ++d) {
        const float *xd = xi + (int64_t)d * positions;
        for (int64_t p = 0; p < positions; ++p)
            sc[p] += xd[p] * xd[p];
    }
    for (int64_t p = 0; p < positions; ++p)
        sc[p] = sc[p] * coef + k;
}

/* top of images [0, n), and their scale when ``scale`` is not NULL (else the backward
 * remakes it from x). Returns -1 when out of memory. */
int lrn_across_forward(const float *restrict x, float *restrict top, float *restrict scale,
                       int64_t n, int channels, int64_t positions, int size, float alpha,
                       float beta, float k)
{
    const float coef = alpha / size;
    float *power = malloc(sizeof(float) * (size_t)positions);
    float *own = scale ? NULL : malloc(sizeof(float) * (size_t)positions);
    if (power == NULL || (scale == NULL && own == NULL)) {
        free(power);
        free(own);
        return -1;
    }
    for (int64_t i = 0; i < n; ++i) {
        const float *xi = x + i * channels * positions;
        for (int c = 0; c < channels; ++c) {
            float *sc = scale ? scale + (i * channels + c) * positions : own;
            window_scale(xi, sc, c, channels, positions, size, coef, k);
            negative_power(sc, power, positions, beta);
            const float *xc = xi + (int64_t)c * positions;
            float *tc = top + (i * channels + c) * positions;
            for (int64_t p = 0; p < positions; ++p)
                tc[p] = xc[p] * power[p];
        }
    }
    free(power);
    free(own);
    return 0;
}

/* dx of images [0, n) from the forward's top and its scale (NULL: remade from x with k).
 * Returns -1 when out of memory. */
int lrn_across_backward(const float *restrict x, const float *restrict top,
                        const float *restrict scale, const float *restrict dy,
                        float *restrict dx, int64_t n, int channels, int64_t positions,
                        int size, float alpha, float beta, float k)
{
    const int half = (size - 1) / 2;
    const float coef = 2.0f * alpha * beta / size;
    const int64_t count = (int64_t)channels * positions;
    /* one image's scale (when remade) and dy * top / scale; a plane's power and window */
    float *own = scale ? NULL : malloc(sizeof(float) * (size_t)count);
    float *ratio = malloc(sizeof(float) * (size_t)count);
    float *power = malloc(sizeof(float) * (size_t)positions);
    float *acc = malloc(sizeof(float) * (size_t)positions);
    if ((scale == NULL && own == NULL) || ratio == NULL || power == NULL || acc == NULL) {
        free(own);
        free(ratio);
        free(power);
        free(acc);
        return -1;
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t base = i * count;
        const float *sc = scale ? scale + base : own;
        if (scale == NULL)
            for (int c = 0; c < channels; ++c)
                window_scale(x + base, own + (int64_t)c * positions, c, channels, positions,
                             size, alpha / size, k);
        for (int64_t p = 0; p < count; ++p)
            ratio[p] = dy[base + p] * top[base + p] / sc[p];
        for (int c = 0; c < channels; ++c) {
            const int64_t at = (int64_t)c * positions;
            const int lo = c - half < 0 ? 0 : c - half;
            const int hi = c + half >= channels ? channels - 1 : c + half;
            for (int64_t p = 0; p < positions; ++p)
                acc[p] = 0.0f;
            for (int d = lo; d <= hi; ++d) {
                const float *rd = ratio + (int64_t)d * positions;
                for (int64_t p = 0; p < positions; ++p)
                    acc[p] += rd[p];
            }
            negative_power(sc + at, power, positions, beta);
            for (int64_t p = 0; p < positions; ++p)
                dx[base + at + p] = dy[base + at + p] * power[p]
                    - coef * x[base + at + p] * acc[p];
        }
    }
    free(own);
    free(ratio);
    free(power);
    free(acc);
    return 0;
}
