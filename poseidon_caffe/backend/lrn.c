/* Compiled local response normalisation across channels (lrn.py), Caffe's formulas:
 *
 *     scale = k + alpha/size * sum of x^2 over the size channels centred on c (zero past
 *             the ends),  top = x * scale^-beta,
 *     dx    = dy * scale^-beta - 2 alpha beta/size * x * sum over the same window of
 *             dy * top / scale.
 *
 * numpy makes these as a dozen whole-array passes (squares, shifted adds, powers, products);
 * here each image is one pass over its planes, the window's planes read from cache, every
 * loop running over the positions of a plane on vectors. Arrays are C-contiguous float32
 * (n, channels, positions).
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

/* scale and top of images [0, n). Returns -1 when out of memory. */
int lrn_across_forward(const float *restrict x, float *restrict top, float *restrict scale,
                       int64_t n, int channels, int64_t positions, int size, float alpha,
                       float beta, float k)
{
    const int half = (size - 1) / 2;
    const float coef = alpha / size;
    float *power = malloc(sizeof(float) * (size_t)positions);
    if (power == NULL)
        return -1;
    for (int64_t i = 0; i < n; ++i) {
        const float *xi = x + i * channels * positions;
        for (int c = 0; c < channels; ++c) {
            float *sc = scale + (i * channels + c) * positions;
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
            negative_power(sc, power, positions, beta);
            const float *xc = xi + (int64_t)c * positions;
            float *tc = top + (i * channels + c) * positions;
            for (int64_t p = 0; p < positions; ++p)
                tc[p] = xc[p] * power[p];
        }
    }
    free(power);
    return 0;
}

/* dx of images [0, n) from the forward's scale and top. Returns -1 when out of memory. */
int lrn_across_backward(const float *restrict x, const float *restrict top,
                        const float *restrict scale, const float *restrict dy,
                        float *restrict dx, int64_t n, int channels, int64_t positions,
                        int size, float alpha, float beta)
{
    const int half = (size - 1) / 2;
    const float coef = 2.0f * alpha * beta / size;
    /* ratio = dy * top / scale of one image's channels; power and accumulated window */
    float *ratio = malloc(sizeof(float) * (size_t)(channels * positions));
    float *power = malloc(sizeof(float) * (size_t)positions);
    float *acc = malloc(sizeof(float) * (size_t)positions);
    if (ratio == NULL || power == NULL || acc == NULL) {
        free(ratio);
        free(power);
        free(acc);
        return -1;
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t base = i * channels * positions;
        for (int64_t p = 0; p < channels * positions; ++p)
            ratio[p] = dy[base + p] * top[base + p] / scale[base + p];
        for (int c = 0; c < channels; ++c) {
            const int64_t at = base + (int64_t)c * positions;
            const int lo = c - half < 0 ? 0 : c - half;
            const int hi = c + half >= channels ? channels - 1 : c + half;
            for (int64_t p = 0; p < positions; ++p)
                acc[p] = 0.0f;
            for (int d = lo; d <= hi; ++d) {
                const float *rd = ratio + (int64_t)d * positions;
                for (int64_t p = 0; p < positions; ++p)
                    acc[p] += rd[p];
            }
            negative_power(scale + at, power, positions, beta);
            for (int64_t p = 0; p < positions; ++p)
                dx[at + p] = dy[at + p] * power[p] - coef * x[at + p] * acc[p];
        }
    }
    free(ratio);
    free(power);
    free(acc);
    return 0;
}
