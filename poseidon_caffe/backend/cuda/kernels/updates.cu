// The solvers' update values, Caffe's formulas (solver/updates.py): g (the diff) becomes the
// value that data -= g subtracts; the histories advance in place. The rate and the solver's
// constants arrive as floats; Adam's bias correction is folded into its rate by the caller.
#include "common.cuh"

KERNEL sgd_update(const int n, float* g, float* h, const float momentum,
                  const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) { g[i] = h[i] = momentum * h[i] + local_rate * g[i]; }
}

KERNEL nesterov_update(const int n, float* g, float* h, const float momentum,
                       const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float hi = h[i];
    const float hi_new = h[i] = momentum * hi + local_rate * g[i];
    g[i] = (1.0f + momentum) * hi_new - momentum * hi;
  }
}

KERNEL adagrad_update(const int n, float* g, float* h, const float delta,
                      const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float hi = h[i] = h[i] + gi * gi;
    g[i] = local_rate * gi / (sqrtf(hi) + delta);
  }
}

KERNEL rmsprop_update(const int n, float* g, float* h, const float rms_decay,
                      const float delta, const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float hi = h[i] = rms_decay * h[i] + (1.0f - rms_decay) * gi * gi;
    g[i] = local_rate * gi / (sqrtf(hi) + delta);
  }
}

// h: decayed squared gradients, h2: decayed squared updates
KERNEL adadelta_update(const int n, float* g, float* h, float* h2, const float momentum,
                       const float delta, const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    float gi = g[i];
    const float hi = h[i] = momentum * h[i] + (1.0f - momentum) * gi * gi;
    gi = gi * sqrtf((h2[i] + delta) / (hi + delta));
    h2[i] = momentum * h2[i] + (1.0f - momentum) * gi * gi;
    g[i] = local_rate * gi;
  }
}

// corrected_rate = local_rate * sqrt(1 - beta2^t) / (1 - beta1^t)
KERNEL adam_update(const int n, float* g, float* m, float* v, const float beta1,
                   const float beta2, const float eps_hat, const float corrected_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float mi = m[i] = m[i] * beta1 + gi * (1.0f - beta1);
    const float vi = v[i] = v[i] * beta2 + gi * gi * (1.0f - beta2);
    g[i] = corrected_rate * mi / (sqrtf(vi) + eps_hat);
  }
}
