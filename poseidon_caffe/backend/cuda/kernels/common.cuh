// One source, two builds. Under NVRTC or nvcc a KERNEL is a CUDA kernel whose
// CUDA_KERNEL_LOOP is Caffe's grid-stride loop; under the host C++ compiler it is a plain
// C function whose loop runs i over all n indices in order.
//
// Rules that keep the two builds equal (see ../README.md):
//  - every kernel's first parameter is its index count n, and all of its work is inside
//    one CUDA_KERNEL_LOOP(i, n): the launch size never changes the result;
//  - index i writes only its own outputs and reads nothing another index writes (gather
//    form, no atomics), so the order in which indices run does not matter;
//  - no shared memory, __syncthreads, warp functions or threadIdx outside the loop.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#define KERNEL extern "C" __global__ void
#define DEVICE static __device__ __forceinline__
#define CUDA_KERNEL_LOOP(i, n)                                            \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n);            \
       i += blockDim.x * gridDim.x)
// NVRTC has no C library headers
#define FLT_MAX 3.402823466e+38F
#define FLT_MIN 1.175494351e-38F
DEVICE float quiet_nan() { return __int_as_float(0x7fffffff); }

#else

#include <float.h>
#include <math.h>
#define KERNEL extern "C" void
#define DEVICE static inline
#define CUDA_KERNEL_LOOP(i, n) for (int i = 0; i < (n); ++i)
DEVICE float quiet_nan() { return NAN; }

#endif

DEVICE int imin(int a, int b) { return a < b ? a : b; }
DEVICE int imax(int a, int b) { return a > b ? a : b; }

// A float label or index as an int, truncated toward zero as numpy's astype; a value no int
// holds (NaN, +-huge) becomes INT_MIN on every build, as on x86, not undefined behaviour
DEVICE int as_index(const float v) {
  return (v > -2147483648.0f && v < 2147483648.0f) ? (int)v : (-2147483647 - 1);
}

// the spatial axes an N-d kernel handles (Caffe's im2col_nd allows as many as a blob has)
#define MAX_SPATIAL_AXES 10
