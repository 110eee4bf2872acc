// Copies between blobs of different layouts: concat/slice along an axis, crop, tile.
#include "common.cuh"

// Concat and Slice: a part (outer, part_axis, inner) of a whole (outer, whole_axis, inner)
// at offset along the axis. n = the part's count; to_whole: 1 copies part -> whole (Concat
// forward, Slice backward), 0 whole -> part (Concat backward, Slice forward).
KERNEL concat(const int n, const float* in, const int to_whole, const int inner,
              const int whole_axis, const int part_axis, const int offset, float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int part_block = inner * part_axis;
    const int o = index / part_block;
    const int within = index % part_block;
    const int whole_index = within + (o * whole_axis + offset) * inner;
    if (to_whole) {
      out[whole_index] = in[index];
    } else {
      out[index] = in[whole_index];
    }
  }
}

// Crop: n = the cropped blob's count; geometry (device ints, num_axes each): the source's
// strides, the cropped blob's strides, the offsets. forward: cropped <- source window;
// backward: source window <- cropped (the caller zeroes the rest of the source first).
KERNEL crop_copy(const int n, const int num_axes, const int* geometry, const float* from,
                 float* to, const int forward) {
  const int* src_strides = geometry;
  const int* dst_strides = geometry + num_axes;
  const int* offsets = geometry + 2 * num_axes;
  CUDA_KERNEL_LOOP(index, n) {
    int rest = index;
    int src_index = 0;
    for (int a = 0; a < num_axes; ++a) {
      const int pos = rest / dst_strides[a];
      rest %= dst_strides[a];
      src_index += (pos + offsets[a]) * src_strides[a];
    }
    if (forward) {
      to[index] = from[src_index];
    } else {
      to[src_index] = from[index];
    }
  }
}

// Tile: top (outer, tiles, inner) = bottom (outer, 1, inner); n = the top's count
KERNEL tile_forward(const int n, const float* bottom, const int inner, const int tiles,
                    float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    const int d = index % inner;
    const int o = index / (inner * tiles);
    top[index] = bottom[o * inner + d];
  }
}

// n = the bottom's count: the sum over the tiles, in tile order
KERNEL tile_backward(const int n, const float* top_diff, const int inner, const int tiles,
                     float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int d = index % inner;
    const int o = index / inner;
    float sum = 0;
    for (int t = 0; t < tiles; ++t) sum += top_diff[(o * tiles + t) * inner + d];
    bottom_diff[index] = sum;
  }
}

// Swap the two outer axes: to (b, a, inner) = from (a, b, inner) (+ bias[i] along a, when
// bias is not null); n = the count. Convolution turns dy (num, channels, out) into (channels,
// num, out), one GEMM's operand, and its forward's product back, adding the bias on the way.
KERNEL swap_outer_axes(const int n, const float* from, const int a, const int b,
                       const int inner, const float* bias, float* to) {
  CUDA_KERNEL_LOOP(index, n) {
    const int d = index % inner;
    const int rest = index / inner;
    const int i = rest % a;
    const int j = rest / a;
    const float v = from[((long long)i * b + j) * inner + d];
    to[index] = bias ? v + bias[i] : v;
  }
}
