// Reduction and ArgMax (layers/common.py): one index per output row, looping over its row
// (gather form; no atomics). Sums are taken in double, as close to numpy's pairwise float sum
// as a sequential one gets.
#include "common.cuh"

// Reduction ops, as caffe.proto's ReductionParameter numbers them
#define REDUCE_SUM 1
#define REDUCE_ASUM 2
#define REDUCE_SUMSQ 3
#define REDUCE_MEAN 4

// x as (n, dim): y[r] = op over row r, times coeff
KERNEL reduction_forward(const int n, const float* x, const int dim, const int op,
                         const float coeff, float* y) {
  CUDA_KERNEL_LOOP(r, n) {
    double sum = 0.0;
    for (int j = 0; j < dim; ++j) {
      const float v = x[r * dim + j];
      sum += op == REDUCE_ASUM ? (double)fabsf(v) : (op == REDUCE_SUMSQ ? (double)(v * v) : v);
    }
    float out = (float)sum;
    if (op == REDUCE_MEAN) out = out / (float)dim;
    y[r] = out * coeff;
  }
}

// n = rows * dim: dx = d op / dx scaled by dy[row] coeff
KERNEL reduction_backward(const int n, const float* x, const float* dy, const int dim,
                          const int op, const float coeff, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float s = dy[i / dim] * coeff;
    const float v = x[i];
    if (op == REDUCE_ASUM) {
      dx[i] = (float)((v > 0) - (v < 0)) * s;
    } else if (op == REDUCE_SUMSQ) {
      dx[i] = 2.0f * v * s;
    } else if (op == REDUCE_MEAN) {
      dx[i] = s / (float)dim;
    } else {
      dx[i] = s;
    }
  }
}

// ArgMax over rows of dim values, element j of row (o, s) at x[(o * dim + j) * inner + s];
// n = outer * inner rows. The k-th pick is the largest (value, index) pair below the one
// before it (larger index first among equal values), so no scratch memory is needed.
// has_axis: y[(o * top_k + k) * inner + s] = value (out_max_val) or index; else (inner = 1)
// y[r * top_k + k] = index, and with out_max_val the values follow each row's indices.
KERNEL argmax_forward(const int n, const float* x, const int dim, const int inner,
                      const int top_k, const int out_max_val, const int has_axis, float* y) {
  CUDA_KERNEL_LOOP(r, n) {
    const int o = r / inner, s = r % inner;
    const float* row = x + o * dim * inner + s;
    float prev_v = 0.0f;
    int prev_j = -1;
    for (int k = 0; k < top_k; ++k) {
      int best = -1;
      float best_v = 0.0f;
      for (int j = dim - 1; j >= 0; --j) {
        const float v = row[j * inner];
        const int below = prev_j < 0 || v < prev_v || (v == prev_v && j < prev_j);
        if (below && (best < 0 || v > best_v)) {
          best = j;
          best_v = v;
        }
      }
      if (best < 0) best = 0;    // only when NaNs leave nothing comparable
      prev_v = best_v;
      prev_j = best;
      if (has_axis) {
        y[(o * top_k + k) * inner + s] = out_max_val ? best_v : (float)best;
      } else if (out_max_val) {
        y[r * 2 * top_k + k] = (float)best;
        y[r * 2 * top_k + top_k + k] = best_v;
      } else {
        y[r * top_k + k] = (float)best;
      }
    }
  }
}
