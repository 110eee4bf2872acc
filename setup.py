"""The optional compiled kernels of the CPU backend (poseidon_caffe/backend/cpu/kernels/*.c); everything else about the
package is in setup.cfg. Without a C compiler the install goes on and the numpy paths run."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("poseidon_caffe.backend.cpu._kernels",
                             ["poseidon_caffe/backend/cpu/kernels/pooling.c",
                              "poseidon_caffe/backend/cpu/kernels/lrn.c",
                              "poseidon_caffe/backend/cpu/kernels/direct.c",
                              "poseidon_caffe/backend/cpu/kernels/winograd.c",
                              "poseidon_caffe/backend/cpu/kernels/columns.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_lanes.c",
                              "poseidon_caffe/backend/cpu/kernels/dropout.c",
                              "poseidon_caffe/backend/cpu/kernels/image_gemm.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_same.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_stride2.c",
                              "poseidon_caffe/backend/cpu/kernels/relu.c",
                              "poseidon_caffe/backend/cpu/kernels/softmax.c",
                              "poseidon_caffe/backend/cpu/kernels/parts.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_ave_vectors.c"],
                             depends=["poseidon_caffe/backend/cpu/kernels/vector_loop.h",
                                      "poseidon_caffe/backend/cpu/kernels/avx512.h",
                                      "poseidon_caffe/backend/cpu/kernels/transpose16.h",
                                      "poseidon_caffe/backend/cpu/kernels/parts.h"],
                             extra_compile_args=["-O3", "-std=c99", "-fno-wrapv",
                                                 "-fno-math-errno"],
                             libraries=["m", "pthread"],
                             optional=True)])
