// Pooling over (num * channels) maps of height x width, Caffe's window rules (backend/ops.py,
// backend/cpu/pool.py): MAX ignores padding and the first maximum in row-major order wins; its
// mask is the winner's h * width + w, -1 for a window wholly past the input (output -FLT_MAX,
// no gradient). AVE divides by the window clipped to input + padding. STOCHASTIC has no
// padding: at TRAIN it draws the element where the running sum first reaches uniform * sum
// (mask as MAX, so MAX's backward routes its gradient); at TEST it outputs sum(x^2) / sum(x)
// and keeps both sums for its exact gradient. Backward kernels gather over the windows that
// hold each input element.
#include "common.cuh"

// n = num * channels * pooled_h * pooled_w; top_mask (float, may be null) gets the mask too
KERNEL max_pool_forward(const int n, const float* bottom, const int height, const int width,
                        const int pooled_h, const int pooled_w, const int kernel_h,
                        const int kernel_w, const int stride_h, const int stride_w,
                        const int pad_h, const int pad_w, float* top, int* mask,
                        float* top_mask) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int c = index / pooled_w / pooled_h;
    const int hstart = imax(ph * stride_h - pad_h, 0);
    const int wstart = imax(pw * stride_w - pad_w, 0);
    const int hend = imin(ph * stride_h - pad_h + kernel_h, height);
    const int wend = imin(pw * stride_w - pad_w + kernel_w, width);
    float best = -FLT_MAX;
    int best_index = -1;
    const float* map = bottom + c * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        if (best_index < 0 || map[h * width + w] > best) {
          best = map[h * width + w];
          best_index = h * width + w;
        }
      }
    }
    top[index] = best;
    mask[index] = best_index;
    if (top_mask) top_mask[index] = (float)best_index;
  }
}

// n = num * channels * height * width (MAX, and STOCHASTIC at TRAIN with pad 0)
KERNEL max_pool_backward(const int n, const float* top_diff, const int* mask,
                         const int height, const int width, const int pooled_h,
                         const int pooled_w, const int kernel_h, const int kernel_w,
                         const int stride_h, const int stride_w, const int pad_h,
                         const int pad_w, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int c = index / width / height;
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = imin((h + pad_h) / stride_h + 1, pooled_h);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = imin((w + pad_w) / stride_w + 1, pooled_w);
    float gradient = 0;
    const int offset = c * pooled_h * pooled_w;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        if (mask[offset + ph * pooled_w + pw] == h * width + w) {
          gradient += top_diff[offset + ph * pooled_w + pw];
        }
      }
    }
    bottom_diff[index] = gradient;
  }
}

KERNEL ave_pool_forward(const int n, const float* bottom, const int height, const int width,
                        const int pooled_h, const int pooled_w, const int kernel_h,
                        const int kernel_w, const int stride_h, const int stride_w,
                        const int pad_h, const int pad_w, float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int c = index / pooled_w / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    int hend = imin(hstart + kernel_h, height + pad_h);
    int wend = imin(wstart + kernel_w, width + pad_w);
    const int pool_size = (hend - hstart) * (wend - wstart);
    hstart = imax(hstart, 0);
    wstart = imax(wstart, 0);
    hend = imin(hend, height);
    wend = imin(wend, width);
    float sum = 0;
    const float* map = bottom + c * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) sum += map[h * width + w];
    }
    top[index] = sum / pool_size;
  }
}

KERNEL ave_pool_backward(const int n, const float* top_diff, const int height,
                         const int width, const int pooled_h, const int pooled_w,
                         const int kernel_h, const int kernel_w, const int stride_h,
                         const int stride_w, const int pad_h, const int pad_w,
                         float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width + pad_w;
    const int h = (index / width) % height + pad_h;
    const int c = index / width / height;
    const int phstart = (h < kernel_h) ? 0 : (h - kernel_h) / stride_h + 1;
    const int phend = imin(h / stride_h + 1, pooled_h);
    const int pwstart = (w < kernel_w) ? 0 : (w - kernel_w) / stride_w + 1;
    const int pwend = imin(w / stride_w + 1, pooled_w);
    float gradient = 0;
    const float* diff = top_diff + c * pooled_h * pooled_w;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int hstart = ph * stride_h - pad_h;
        const int wstart = pw * stride_w - pad_w;
        const int hend = imin(hstart + kernel_h, height + pad_h);
        const int wend = imin(wstart + kernel_w, width + pad_w);
        const int pool_size = (hend - hstart) * (wend - wstart);
        gradient += diff[ph * pooled_w + pw] / pool_size;
      }
    }
    bottom_diff[index] = gradient;
  }
}

// uniform: one draw in [0, 1) per output
KERNEL sto_pool_forward_train(const int n, const float* bottom, const int height,
                              const int width, const int pooled_h, const int pooled_w,
                              const int kernel_h, const int kernel_w, const int stride_h,
                              const int stride_w, const float* uniform, float* top,
                              int* mask) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int c = index / pooled_w / pooled_h;
    const int hstart = ph * stride_h;
    const int hend = imin(hstart + kernel_h, height);
    const int wstart = pw * stride_w;
    const int wend = imin(wstart + kernel_w, width);
    const float* map = bottom + c * height * width;
    float total = 0;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) total += map[h * width + w];
    }
    const float threshold = uniform[index] * total;
    float running = 0;
    float value = 0;
    int chosen = -1;
    for (int h = hstart; h < hend && chosen < 0; ++h) {
      for (int w = wstart; w < wend; ++w) {
        running += map[h * width + w];
        if (running >= threshold) {
          value = map[h * width + w];
          chosen = h * width + w;
          break;
        }
      }
    }
    top[index] = value;
    mask[index] = chosen;
  }
}

KERNEL sto_pool_forward_test(const int n, const float* bottom, const int height,
                             const int width, const int pooled_h, const int pooled_w,
                             const int kernel_h, const int kernel_w, const int stride_h,
                             const int stride_w, float* top, float* num, float* den) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int c = index / pooled_w / pooled_h;
    const int hstart = ph * stride_h;
    const int hend = imin(hstart + kernel_h, height);
    const int wstart = pw * stride_w;
    const int wend = imin(wstart + kernel_w, width);
    const float* map = bottom + c * height * width;
    float squares = 0;
    float sum = FLT_MIN;            // an all-zero window gives 0, not 0 / 0
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        const float v = map[h * width + w];
        squares += v * v;
        sum += v;
      }
    }
    top[index] = squares / sum;
    num[index] = squares;
    den[index] = sum;
  }
}

// d/dx of sum(x^2) / sum(x) over each window holding x: (2 x den - num) / den^2
KERNEL sto_pool_backward_test(const int n, const float* bottom, const float* top_diff,
                              const float* num, const float* den, const int height,
                              const int width, const int pooled_h, const int pooled_w,
                              const int kernel_h, const int kernel_w, const int stride_h,
                              const int stride_w, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int c = index / width / height;
    const int phstart = (h < kernel_h) ? 0 : (h - kernel_h) / stride_h + 1;
    const int phend = imin(h / stride_h + 1, pooled_h);
    const int pwstart = (w < kernel_w) ? 0 : (w - kernel_w) / stride_w + 1;
    const int pwend = imin(w / stride_w + 1, pooled_w);
    const float x = bottom[index];
    const int offset = c * pooled_h * pooled_w;
    float gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int o = offset + ph * pooled_w + pw;
        const float d = den[o];
        const float a = top_diff[o] * 2.0f / d;
        const float b = top_diff[o] * num[o] / (d * d);
        gradient += a * x - b;
      }
    }
    bottom_diff[index] = gradient;
  }
}
