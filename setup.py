"""The optional compiled kernels of the CPU backend (poseidon_caffe/backend/cpu/kernels/*.c); everything else about the
package is in setup.cfg. Without a C compiler the install goes on and the numpy paths run."""
import os
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Skylake-family CPUs keep a loop out of their cache of decoded instructions when a jump in it
# crosses or ends on a 32-byte boundary (the microcode fix of Intel's JCC erratum): a tight
# loop then runs up to a fifth slower as the linker happens to place it (AlexNet's MAX pooling
# backward, whose code did not change, went 5.5 -> 6.2 ms when other kernels were added). The
# GNU assembler pads such jumps where asked; other assemblers do without.
JUMP_PADDING = "-Wa,-mbranches-within-32B-boundaries"


class BuildKernels(build_ext):
    def build_extensions(self):
        if self._takes(JUMP_PADDING):
            for ext in self.extensions:
                ext.extra_compile_args.append(JUMP_PADDING)
        super().build_extensions()

    def _takes(self, flag):
        """Whether the compiler builds a trivial file with ``flag``."""
        with tempfile.TemporaryDirectory() as tmp:
            probe = os.path.join(tmp, "probe.c")
            with open(probe, "w") as f:
                f.write("int probe(void) { return 0; }\n")
            try:
                self.compiler.compile([probe], output_dir=tmp, extra_postargs=[flag])
            except Exception:
                return False
        return True


setup(cmdclass={"build_ext": BuildKernels},
      ext_modules=[Extension("poseidon_caffe.backend.cpu._kernels",
                             ["poseidon_caffe/backend/cpu/kernels/pooling.c",
                              "poseidon_caffe/backend/cpu/kernels/lrn.c",
                              "poseidon_caffe/backend/cpu/kernels/direct.c",
                              "poseidon_caffe/backend/cpu/kernels/winograd.c",
                              "poseidon_caffe/backend/cpu/kernels/columns.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_lanes.c",
                              "poseidon_caffe/backend/cpu/kernels/dropout.c",
                              "poseidon_caffe/backend/cpu/kernels/image_gemm.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_packed.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_same.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_stride2.c",
                              "poseidon_caffe/backend/cpu/kernels/relu.c",
                              "poseidon_caffe/backend/cpu/kernels/softmax.c",
                              "poseidon_caffe/backend/cpu/kernels/parts.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_ave_vectors.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_lanes8.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_rows.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_tiles.c",
                              "poseidon_caffe/backend/cpu/kernels/pool_gather.c"],
                             depends=["poseidon_caffe/backend/cpu/kernels/vector_loop.h",
                                      "poseidon_caffe/backend/cpu/kernels/avx512.h",
                                      "poseidon_caffe/backend/cpu/kernels/avx2.h",
                                      "poseidon_caffe/backend/cpu/kernels/transpose16.h",
                                      "poseidon_caffe/backend/cpu/kernels/parts.h",
                                      "poseidon_caffe/backend/cpu/kernels/pool_window.h",
                                      "poseidon_caffe/backend/cpu/kernels/fetch_ahead.h",
                                      "poseidon_caffe/backend/cpu/kernels/max_tap8.h",
                                      "poseidon_caffe/backend/cpu/kernels/max_rows3.h"],
                             extra_compile_args=["-O3", "-std=c99", "-fno-wrapv",
                                                 "-fno-math-errno"],
                             libraries=["m", "pthread"],
                             optional=True)])
