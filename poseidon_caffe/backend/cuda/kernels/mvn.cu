// MVN (layers/normalization.py) on (rows, dim): per-row statistics, one index per row summed
// in double (the CPU op averages in float64), then elementwise passes. The backward's row
// means are taken before dx is written, so dx may be dy itself (in place).
#include "common.cuh"

// n = rows; mean[r] = average of row r; with normalize_variance, std[r] = sqrt(average of
// (x - mean)^2) + eps (Caffe adds eps to the standard deviation; the squares in float, as
// numpy's), else std is not written
KERNEL mvn_row_stats(const int n, const float* x, const int dim, const int normalize_variance,
                     const float eps, float* mean, float* std) {
  CUDA_KERNEL_LOOP(r, n) {
    const float* row = x + r * dim;
    double sum = 0;
    for (int j = 0; j < dim; ++j) sum += row[j];
    const float m = (float)(sum / dim);
    mean[r] = m;
    if (normalize_variance) {
      double squares = 0;
      for (int j = 0; j < dim; ++j) {
        const float d = row[j] - m;
        squares += d * d;
      }
      std[r] = (float)(sqrt(squares / dim) + (double)eps);
    }
  }
}

// n = rows * dim: y = (x - mean) / std (std null: no division); y may be x
KERNEL mvn_normalize(const int n, const float* x, const float* mean, const float* std,
                     const int dim, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / dim;
    const float centred = x[i] - mean[r];
    y[i] = std ? centred / std[r] : centred;
  }
}

// n = rows; mean_dy[r] = average of dy over row r; mean_dy_y[r] = average of dy y (y null:
// not written)
KERNEL mvn_row_grads(const int n, const float* dy, const float* y, const int dim,
                     float* mean_dy, float* mean_dy_y) {
  CUDA_KERNEL_LOOP(r, n) {
    double sum = 0, products = 0;
    for (int j = 0; j < dim; ++j) {
      const float g = dy[r * dim + j];
      sum += g;
      if (y) products += g * y[r * dim + j];
    }
    mean_dy[r] = (float)(sum / dim);
    if (y) mean_dy_y[r] = (float)(products / dim);
  }
}

// n = rows * dim: dx = dy - mean_dy, then (that - y mean_dy_y) / std when std is not null;
// dx may be dy
KERNEL mvn_backward(const int n, const float* dy, const float* y, const float* mean_dy,
                    const float* mean_dy_y, const float* std, const int dim, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / dim;
    const float g = dy[i] - mean_dy[r];
    dx[i] = std ? (g - y[i] * mean_dy_y[r]) / std[r] : g;
  }
}
