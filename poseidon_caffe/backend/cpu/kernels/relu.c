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
#include <stddef.h>
#include <stdint.h>

#include "parts.h"
#include "vector_loop.h"

static inline float relu(float v, float slope)
{
    return (v < 0.0f ? 0.0f : v) + slope * (0.0f < v ? 0.0f : v);
}

/* (v > 0) + slope (v <= 0), the second term a choice of slope or slope times 0 (``off``),
 * what the product is either way: written as the product, AVX2's clone kept a branch a value. */
static inline float relu_slope(float v, float slope, float off)
{
    return (v > 0.0f ? 1.0f : 0.0f) + (v <= 0.0f ? slope : off);
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
    const float off = slope * 0.0f;
    for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * relu_slope(x[i], slope, off);
}

VECTOR_LOOP
static void backward_in_place(const float *restrict x, float *restrict d, int64_t n,
                              float slope)
{
    const float off = slope * 0.0f;
    for (int64_t i = 0; i < n; ++i)
        d[i] *= relu_slope(x[i], slope, off);
}

/* One call's arrays, for its parts (parts.c). */
struct relu_pass {
    const float *x, *dy;
    float *y;               /* forward's output, or backward's dx */
    float slope;
};

static void forward_part(void *ctx, int64_t lo, int64_t hi)
{
    const struct relu_pass *p = ctx;
    if (p->x == p->y)
        forward_in_place(p->y + lo, hi - lo, p->slope);
    else
        forward(p->x + lo, p->y + lo, hi - lo, p->slope);
}

static void backward_part(void *ctx, int64_t lo, int64_t hi)
{
    const struct relu_pass *p = ctx;
    if (p->y == p->dy)
        backward_in_place(p->x + lo, p->y + lo, hi - lo, p->slope);
    else
        backward(p->x + lo, p->dy + lo, p->y + lo, hi - lo, p->slope);
}

/* y may be x; otherwise the two do not overlap. In `parts` parts side by side, their bounds
 * on 64-byte lines. */
int relu_forward(const float *x, float *y, int64_t n, float slope, int parts)
{
    struct relu_pass pass = {x, NULL, y, slope};
    run_in_parts(forward_part, &pass, n, parts, 16);
    return 0;
}

/* dx may be dy; otherwise none of the three overlap. */
int relu_backward(const float *x, const float *dy, float *dx, int64_t n, float slope,
                  int parts)
{
    struct relu_pass pass = {x, dy, dx, slope};
    run_in_parts(backward_part, &pass, n, parts, 16);
    return 0;
}
