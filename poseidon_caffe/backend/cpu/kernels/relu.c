/* ReLU, forward and backward, in Caffe's CPU arithmetic (relu_layer.cpp):
 *
 *     y  = max(x, 0) + slope * min(x, 0)          (std::max and std::min: a NaN passes;
 *                                                  -inf gives NaN, even with slope 0)
 *     dx = dy * ((x > 0) + slope * (x <= 0))
 *
 * numpy's maximum here runs a value at a time (0.8 ns a value, a fifth of the memory's rate);
 * these loops are one pass at the memory's rate. Caffe's in-place ReLU (y is x, dx is dy) has
 * loops of its own: with restrict pointers that may alias, the compiler would guard the
 * vector loop with an overlap test that an in-place call fails. */
#include <stdint.h>

#include "vector_loop.h"

static inline float relu(float v, float slope)
{
    return (v < 0.0f ? 0.0f : v) + slope * (0.0f < v ? 0.0f : v);
}

static inline float relu_slope(float v, float slope)
{
    return (v > 0.0f ? 1.0f : 0.0f) + slope * (v <= 0.0f ? 1.0f : 0.0f);
}

VECTOR_LOOP
static void forward(const float *restrict x, float *restrict y, int64_t n, float slope)
{
    for (int64_t i = 0; i < n; ++i)
        y[i] = relu(x[i], slope);
}

VECTOR_LOOP
static void forward_in_place(float *y, int64_t n, float slope)
{
    for (int64_t i = 0; i < n; ++i)
        y[i] = relu(y[i], slope);
}

VECTOR_LOOP
static void backward(const float *restrict x, const float *restrict dy, float *restrict dx,
                     int64_t n, float slope)
{
    for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * relu_slope(x[i], slope);
}

VECTOR_LOOP
static void backward_in_place(const float *restrict x, float *restrict d, int64_t n,
                              float slope)
{
    for (int64_t i = 0; i < n; ++i)
        d[i] *= relu_slope(x[i], slope);
}

/* y may be x; otherwise the two do not overlap. */
int relu_forward(const float *x, float *y, int64_t n, float slope)
{
    if (x == y)
        forward_in_place(y, n, slope);
    else
        forward(x, y, n, slope);
    return 0;
}

/* dx may be dy; otherwise none of the three overlap. */
int relu_backward(const float *x, const float *dy, float *dx, int64_t n, float slope)
{
    if (dx == dy)
        backward_in_place(x, dx, n, slope);
    else
        backward(x, dy, dx, n, slope);
    return 0;
}
