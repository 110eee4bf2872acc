// Local response normalisation on (num, channels, height, width), backend/lrn.py's math:
//   across channels: scale = k + alpha/size * sum of x^2 over the size channels centred on c
//   within a channel: scale = 1 + alpha/size^2 * sum of x^2 over the size x size window
//                     centred on the pixel (zero padded)
//   top = x * scale^-beta;
//   dx = dy * scale^-beta - 2 alpha beta / norm * x * windowsum(dy * top / scale).
// Windows are summed centre first, then the elements at distance 1, 2, ... (before, then
// after), and within a channel rows before columns: the CPU backend's order, so both give
// the same floats. coef is alpha / norm (forward) or 2 alpha beta / norm (backward), norm
// being size or size^2.
#include "common.cuh"

DEVICE float negative_power(const float scale, const float beta) {
  // the square-root forms of the usual betas, as the CPU backend computes them
  if (beta == 0.75f) {
    float p = sqrtf(scale);
    p = p * sqrtf(p);
    return 1.0f / p;
  }
  if (beta == 0.5f) return 1.0f / sqrtf(scale);
  return powf(scale, -beta);
}

// the window sum along one axis of f at (base + j * step), j centred on pos in [0, length)
#define WINDOW_SUM(acc, f, pos, length, half, base, step)                   \
  do {                                                                      \
    acc = f((base) + (pos) * (step));                                       \
    for (int shift_ = 1; shift_ <= (half) && shift_ < (length); ++shift_) { \
      if ((pos) - shift_ >= 0) acc += f((base) + ((pos) - shift_) * (step)); \
      if ((pos) + shift_ < (length))                                        \
        acc += f((base) + ((pos) + shift_) * (step));                       \
    }                                                                       \
  } while (0)

DEVICE float square_at(const float* x, const int i) { return x[i] * x[i]; }

// n = num * channels * height * width
KERNEL lrn_scale_across(const int n, const float* x, const int channels, const int height,
                        const int width, const int size, const float coef, const float k,
                        float* scale) {
  CUDA_KERNEL_LOOP(index, n) {
    const int spatial = height * width;
    const int c = (index / spatial) % channels;
    const int base = index - c * spatial;
    float acc;
#define SQ(i) square_at(x, i)
    WINDOW_SUM(acc, SQ, c, channels, (size - 1) / 2, base, spatial);
#undef SQ
    scale[index] = acc * coef + k;
  }
}

KERNEL lrn_scale_within(const int n, const float* x, const int height, const int width,
                        const int size, const float coef, float* scale) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int map = index - h * width - w;
    const int half = (size - 1) / 2;
    // a row of the window: the column sums (over rows) at each of its columns
#define SQ(i) square_at(x, i)
    float acc;
    float col;
    WINDOW_SUM(col, SQ, h, height, half, map + w, width);
    acc = col;
    for (int s = 1; s <= half && s < width; ++s) {
      if (w - s >= 0) {
        WINDOW_SUM(col, SQ, h, height, half, map + w - s, width);
        acc += col;
      }
      if (w + s < width) {
        WINDOW_SUM(col, SQ, h, height, half, map + w + s, width);
        acc += col;
      }
    }
#undef SQ
    scale[index] = acc * coef + 1.0f;
  }
}

KERNEL lrn_output(const int n, const float* x, const float* scale, const float beta,
                  float* top) {
  CUDA_KERNEL_LOOP(index, n) { top[index] = negative_power(scale[index], beta) * x[index]; }
}

DEVICE float ratio_at(const float* dy, const float* top, const float* scale, const int i) {
  return dy[i] * top[i] / scale[i];
}

KERNEL lrn_diff_across(const int n, const float* x, const float* top, const float* scale,
                       const float* dy, const int channels, const int height, const int width,
                       const int size, const float beta, const float coef, float* dx) {
  CUDA_KERNEL_LOOP(index, n) {
    const int spatial = height * width;
    const int c = (index / spatial) % channels;
    const int base = index - c * spatial;
    float acc;
#define RATIO(i) ratio_at(dy, top, scale, i)
    WINDOW_SUM(acc, RATIO, c, channels, (size - 1) / 2, base, spatial);
#undef RATIO
    dx[index] = negative_power(scale[index], beta) * dy[index] - acc * x[index] * coef;
  }
}

KERNEL lrn_diff_within(const int n, const float* x, const float* top, const float* scale,
                       const float* dy, const int height, const int width, const int size,
                       const float beta, const float coef, float* dx) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int map = index - h * width - w;
    const int half = (size - 1) / 2;
#define RATIO(i) ratio_at(dy, top, scale, i)
    float acc;
    float col;
    WINDOW_SUM(col, RATIO, h, height, half, map + w, width);
    acc = col;
    for (int s = 1; s <= half && s < width; ++s) {
      if (w - s >= 0) {
        WINDOW_SUM(col, RATIO, h, height, half, map + w - s, width);
        acc += col;
      }
      if (w + s < width) {
        WINDOW_SUM(col, RATIO, h, height, half, map + w + s, width);
        acc += col;
      }
    }
#undef RATIO
    dx[index] = negative_power(scale[index], beta) * dy[index] - acc * x[index] * coef;
  }
}
