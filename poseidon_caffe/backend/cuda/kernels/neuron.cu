// Neuron (elementwise) layers: forward y = f(x), backward dx = dy * f'(...), in the CPU
// layers' formulas (layers/neuron.py). Scalars a layer derives in double (Power's
// diff_scale, Log's scale * base_scale, Swish's beta / 2) arrive already rounded to float,
// as numpy rounds them. Every kernel may run in place (y == x, dx == dy).
#include "common.cuh"

KERNEL relu_forward(const int n, const float* x, float* y, const float slope) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = v > 0 ? v : v * slope;
  }
}

KERNEL relu_backward(const int n, const float* dy, const float* x, float* dx,
                     const float slope) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * (x[i] > 0 ? 1.0f : slope); }
}

KERNEL sigmoid_forward(const int n, const float* x, float* y) {
  // the tanh form never overflows
  CUDA_KERNEL_LOOP(i, n) { y[i] = 0.5f * tanhf(0.5f * x[i]) + 0.5f; }
}

KERNEL sigmoid_backward(const int n, const float* dy, const float* y, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = y[i];
    dx[i] = dy[i] * v * (1.0f - v);
  }
}

KERNEL tanh_forward(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = tanhf(x[i]); }
}

KERNEL tanh_backward(const int n, const float* dy, const float* y, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = y[i];
    dx[i] = dy[i] * (1.0f - v * v);
  }
}

KERNEL elu_forward(const int n, const float* x, float* y, const float alpha) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = v > 0 ? v : alpha * expm1f(v);
  }
}

KERNEL elu_backward(const int n, const float* dy, const float* x, const float* y, float* dx,
                    const float alpha) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * (x[i] > 0 ? 1.0f : y[i] + alpha); }
}

KERNEL abs_forward(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = fabsf(x[i]); }
}

KERNEL abs_backward(const int n, const float* dy, const float* x, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    dx[i] = dy[i] * (float)((v > 0) - (v < 0));
  }
}

KERNEL bnll_forward(const int n, const float* x, float* y) {
  // log(1 + e^x) without overflow
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v)));
  }
}

KERNEL bnll_backward(const int n, const float* dy, const float* x, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float e = expf(fminf(x[i], 50.0f));    // Caffe's kBNLL_THRESHOLD
    dx[i] = dy[i] * e / (e + 1.0f);
  }
}

KERNEL power_forward(const int n, const float* x, float* y, const float power,
                     const float scale, const float shift) {
  CUDA_KERNEL_LOOP(i, n) {
    const float base = shift + scale * x[i];
    y[i] = power == 1.0f ? base : powf(base, power);
  }
}

KERNEL power_backward(const int n, const float* dy, const float* x, float* dx,
                      const float power, const float scale, const float shift,
                      const float diff_scale) {
  CUDA_KERNEL_LOOP(i, n) {
    if (diff_scale == 0.0f) {
      dx[i] = 0.0f;
    } else if (power == 1.0f) {
      dx[i] = dy[i] * diff_scale;
    } else {
      const float base = shift + scale * x[i];
      dx[i] = dy[i] * diff_scale * powf(base, power - 1.0f);
    }
  }
}

KERNEL exp_forward(const int n, const float* x, float* y, const float inner_scale,
                   const float outer_scale) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = expf(inner_scale * x[i]) * outer_scale; }
}

KERNEL exp_backward(const int n, const float* dy, const float* y, float* dx,
                    const float inner_scale) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * y[i] * inner_scale; }
}

KERNEL log_forward(const int n, const float* x, float* y, const float scale,
                   const float shift, const float base_scale) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = logf(shift + scale * x[i]) * base_scale; }
}

// diff_scale = scale * base_scale
KERNEL log_backward(const int n, const float* dy, const float* x, float* dx,
                    const float scale, const float shift, const float diff_scale) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * diff_scale / (shift + scale * x[i]); }
}

KERNEL threshold_forward(const int n, const float* x, float* y, const float threshold) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] > threshold ? 1.0f : 0.0f; }
}

KERNEL clip_forward(const int n, const float* x, float* y, const float lo, const float hi) {
  // a NaN passes through, as np.clip lets it
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = v < lo ? lo : (v > hi ? hi : v);
  }
}

KERNEL clip_backward(const int n, const float* dy, const float* x, float* dx,
                     const float lo, const float hi) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    dx[i] = dy[i] * (v >= lo && v <= hi ? 1.0f : 0.0f);
  }
}

// y = x * sigmoid(beta x); the sigmoid is kept for backward
KERNEL swish_forward(const int n, const float* x, float* y, float* sigmoid,
                     const float half_beta) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    const float s = 0.5f * tanhf(half_beta * v) + 0.5f;
    sigmoid[i] = s;
    y[i] = v * s;
  }
}

KERNEL swish_backward(const int n, const float* dy, const float* y, const float* sigmoid,
                      float* dx, const float beta) {
  CUDA_KERNEL_LOOP(i, n) {
    const float by = beta * y[i];
    const float s = sigmoid[i];
    dx[i] = dy[i] * (by + s * (1.0f - by));
  }
}

// Inverted dropout at TRAIN: y = x scale where index i's draw keeps it, else 0 (x times 0,
// so a NaN stays NaN as in Caffe). The draws are a counter hash of (key, i), the same bits on
// every backend (backend/ops.py): nothing is drawn on the host or uploaded, and backward
// recomputes the mask from the key. Forward and backward are this one map (dy for x).
DEVICE unsigned int dropout_mix(unsigned int v) {
  v ^= v >> 16;
  v *= 0x85ebca6bu;
  v ^= v >> 13;
  v *= 0xc2b2ae35u;
  v ^= v >> 16;
  return v;
}

// keep where the draw's top 24 bits >= threshold (= ceil(ratio 2^24))
KERNEL dropout_apply(const int n, const float* x, const int key0, const int key1,
                     const int threshold, const float scale, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const unsigned int bits =
        dropout_mix(dropout_mix((unsigned int)i ^ (unsigned int)key0) ^ (unsigned int)key1);
    y[i] = x[i] * ((int)(bits >> 8) >= threshold ? 1.0f : 0.0f) * scale;
  }
}
