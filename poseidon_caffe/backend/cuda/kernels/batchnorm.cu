// BatchNorm on (num, channels, spatial): per-channel statistics summed in double (the CPU
// layer averages in float64), normalisation, and the backward.
#include "common.cuh"

// n = channels; mean[c] = average of a (times b where b is not null) over num and spatial
KERNEL channel_mean(const int n, const float* a, const float* b, const int num,
                    const int spatial, float* mean) {
  CUDA_KERNEL_LOOP(c, n) {
    double sum = 0;
    for (int i = 0; i < num; ++i) {
      const int start = (i * n + c) * spatial;
      for (int s = 0; s < spatial; ++s) {
        const float v = b ? a[start + s] * b[start + s] : a[start + s];
        sum += v;
      }
    }
    mean[c] = (float)(sum / ((double)num * spatial));
  }
}

// n = channels; var = average of (x - mean)^2 (the squares in float, as numpy's), and
// std = sqrt(var + eps) from the double variance
KERNEL channel_variance(const int n, const float* x, const float* mean, const int num,
                        const int spatial, const float eps, float* var, float* std) {
  CUDA_KERNEL_LOOP(c, n) {
    double sum = 0;
    const float m = mean[c];
    for (int i = 0; i < num; ++i) {
      const int start = (i * n + c) * spatial;
      for (int s = 0; s < spatial; ++s) {
        const float d = x[start + s] - m;
        sum += d * d;
      }
    }
    const double v = sum / ((double)num * spatial);
    var[c] = (float)v;
    std[c] = (float)sqrt(v + (double)eps);
  }
}

// n = num * channels * spatial: y = (x - mean) / std
KERNEL batchnorm_normalize(const int n, const float* x, const float* mean, const float* std,
                           const int channels, const int spatial, float* y) {
  CUDA_KERNEL_LOOP(index, n) {
    const int c = (index / spatial) % channels;
    y[index] = (x[index] - mean[c]) / std[c];
  }
}

// dx = (dy - mean(dy) - y mean(dy y)) / std with batch statistics; dy / std with global
// ones (global_stats: mean_dy and mean_dy_y are not read)
KERNEL batchnorm_backward(const int n, const float* dy, const float* y,
                          const float* mean_dy, const float* mean_dy_y, const float* std,
                          const int channels, const int spatial, const int global_stats,
                          float* dx) {
  CUDA_KERNEL_LOOP(index, n) {
    const int c = (index / spatial) % channels;
    if (global_stats) {
      dx[index] = dy[index] / std[c];
    } else {
      dx[index] = (dy[index] - mean_dy[c] - y[index] * mean_dy_y[c]) / std[c];
    }
  }
}
