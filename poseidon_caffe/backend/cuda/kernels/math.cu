// Elementwise arithmetic, vec_ names (Caffe's math_functions on the GPU) for what cuBLAS does not cover.
// Each may run in place.
#include "common.cuh"

KERNEL vec_set(const int n, float* y, const float alpha) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = alpha; }
}

KERNEL vec_add_scalar(const int n, float* y, const float alpha) {
  CUDA_KERNEL_LOOP(i, n) { y[i] += alpha; }
}

KERNEL vec_add(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] + b[i]; }
}

KERNEL vec_sub(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] - b[i]; }
}

KERNEL vec_mul(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] * b[i]; }
}

KERNEL vec_div(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] / b[i]; }
}

KERNEL vec_scale(const int n, const float alpha, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = alpha * x[i]; }
}

// y = alpha x + beta y; y is not read when beta is 0 (it may hold anything)
KERNEL vec_axpby(const int n, const float alpha, const float* x, const float beta, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * y[i];
  }
}

KERNEL vec_abs(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = fabsf(x[i]); }
}

KERNEL vec_exp(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = expf(x[i]); }
}

KERNEL vec_log(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = logf(x[i]); }
}

KERNEL vec_powx(const int n, const float* x, float* y, const float alpha) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = powf(x[i], alpha); }
}

KERNEL vec_sqrt(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = sqrtf(x[i]); }
}

KERNEL vec_sign(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = (float)((v > 0) - (v < 0));
  }
}

// Scale: y (outer, dim, inner) = x times scale[d], plus bias[d] where bias is not null
KERNEL channel_scale(const int n, const float* x, const float* scale, const float* bias,
                     const int dim, const int inner, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int d = (i / inner) % dim;
    const float v = x[i] * scale[d];
    y[i] = bias ? v + bias[d] : v;
  }
}
